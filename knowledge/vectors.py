"""Vectors of chunks, with the local embedding model messages use (providers.embeddings): the text a
vector is made of leads with the chunk's path, symbol or heading, so a question naming them finds it."""

from typing import Any

from knowledge.chunking import Draft
from providers.embeddings import embedder_status, to_bytes

EMBED_BATCH = 8


def embedding_text(draft: Draft) -> str:
    lead = " ".join(x for x in (draft.path, draft.symbol, draft.heading) if x)
    return f"{lead}\n{draft.content}" if lead else draft.content


def draft_vectors(drafts: list[Draft]) -> tuple[list[bytes] | None, str]:
    """One float32 vector (as bytes) per draft and the model's name; (None, "") without a model."""
    embedder = embedder_status().embedder
    if embedder is None or not drafts:
        return None, ""
    texts = [embedding_text(d) for d in drafts]
    # Batches of similar length: a batch is padded to its longest text.
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: list[Any] = [None] * len(texts)
    try:
        for i in range(0, len(order), EMBED_BATCH):
            batch = order[i : i + EMBED_BATCH]
            for position, vector in zip(batch, embedder.embed([texts[j] for j in batch]), strict=True):
                out[position] = to_bytes(vector)
    except Exception:  # a remote model that fails: the chunks stay searchable by words
        return None, ""
    return out, embedder.name
