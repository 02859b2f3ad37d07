"""Vectors of chunks, with the local embedding model messages use (providers.embeddings): the text a
vector is made of leads with the chunk's path, symbol or heading, so a question naming them finds it."""

from knowledge.chunking import Draft
from providers.embeddings import embed_by_length, embedder_status, to_bytes


def embedding_text(draft: Draft) -> str:
    lead = " ".join(x for x in (draft.path, draft.symbol, draft.heading) if x)
    return f"{lead}\n{draft.content}" if lead else draft.content


def draft_vectors(drafts: list[Draft]) -> tuple[list[bytes] | None, str]:
    """One float32 vector (as bytes) per draft and the model's name; (None, "") without a model."""
    embedder = embedder_status().embedder
    if embedder is None or not drafts:
        return None, ""
    texts = [embedding_text(d) for d in drafts]
    try:
        vectors = embed_by_length(embedder, texts)
    except Exception:  # a remote model that fails: the chunks stay searchable by words
        return None, ""
    return [to_bytes(v) for v in vectors], embedder.name
