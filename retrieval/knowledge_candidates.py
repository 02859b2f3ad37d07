"""Knowledge's candidates for B5: the chunks in the conversation's scope (tenant-wide, its end user's, its
own) that answer the question, and the images of the conversation whose description (knowledge.vision)
does, each with the citation a prompt shows."""

import re
import uuid
from collections import Counter

from cold_storage.models import ArchivedImage
from conversations.models import Conversation
from knowledge.identifiers import _stem
from knowledge.models import ImageDescription
from providers.text import SEARCH_STOPWORDS
from retrieval.candidates import ChunkHit, Degradation, ImageHit
from retrieval.knowledge import knowledge_search
from retrieval.ranking import Postings
from retrieval.vectors.degraded import VECTOR_STORE_UNAVAILABLE
from tenants.statements import FixedQuery, Read

CANDIDATES = 8
IMAGE_CANDIDATES = 4
# The newest described images of a conversation searched (a computer-use session may hold thousands).
IMAGE_CORPUS = 1000
_WORD = re.compile(r"\w+", re.UNICODE)


def knowledge_candidates(
    *,
    conversation: Conversation,
    query: str,
    min_relevance: float,
    limit: int = CANDIDATES,
    degradations: list[Degradation] | None = None,
) -> list[ChunkHit | ImageHit]:
    """Chunks for B5, best first, then the conversation's images whose description answers; those below
    `min_relevance` are not worth prompt tokens. Lexical only without an embedding model (the retrieve stage
    reports that once, for every store); a vector engine that cannot answer is added to `degradations`."""
    result = knowledge_search(
        tenant_id=conversation.tenant_id, query=query, conversation=conversation, limit=limit
    )
    if degradations is not None:
        degradations += [
            Degradation(d["code"], d["message"])
            for d in result.degradations
            if d["code"] == VECTOR_STORE_UNAVAILABLE
        ]
    out: list[ChunkHit | ImageHit] = [
        ChunkHit(
            chunk_id=hit.chunk.pk,
            document_id=str(hit.chunk.document_id),
            citation=hit.citation,
            content=hit.chunk.content,
            relevance=hit.relevance,
            rank_score=hit.score,
        )
        for hit in result.hits
        if hit.relevance >= min_relevance
    ]
    # Chunks keep their fused order; described images of the conversation follow.
    return out + image_candidates(conversation=conversation, query=query, min_relevance=min_relevance)


def _words(text: str) -> list[str]:
    """Prose terms: lower-case words without stopwords (a description is prose, and a conversation holds too
    few of them for IDF alone to push "the" down), stemmed."""
    return [
        _stem(w)
        for w in _WORD.findall(text.lower())
        if w not in SEARCH_STOPWORDS and (len(w) > 1 or w.isdigit())
    ]


# Read on every context call (most conversations have none): a fixed statement (tenants.statements).
_IMAGES = FixedQuery(
    lambda conversation_id: (
        ArchivedImage.objects.filter(conversation_id=conversation_id, duplicate_of__isnull=True)
        .order_by("-message_seq", "-part_index")
        .values_list("id", "sha256", "message_seq")[:IMAGE_CORPUS]
    ),
    conversation_id=uuid.uuid4(),
)


def image_reads(conversation: Conversation) -> list[Read]:
    """image_candidates' first read, for reading it ahead (tenants.statements)."""
    return [(_IMAGES, {"conversation_id": conversation.pk})]


def image_candidates(
    *, conversation: Conversation, query: str, min_relevance: float, limit: int = IMAGE_CANDIDATES
) -> list[ImageHit]:
    """Images of the conversation whose description holds the question's words, best first: BM25 over the
    conversation's descriptions, as a share of what all the question's words could score (a word no
    description holds counts against it), so "the dialog with the expired password" finds that screenshot."""
    asked = set(_words(query))
    if not asked:
        return []
    images = _IMAGES.run(conversation_id=conversation.pk)
    if not images:  # most conversations: building the descriptions' query cost more than the one above
        return []
    texts = dict(
        ImageDescription.objects.filter(
            tenant_id=conversation.tenant_id, sha256__in={sha for _, sha, _ in images}
        ).values_list("sha256", "text")
    )
    corpus = [(image_id, seq, texts[sha]) for image_id, sha, seq in images if sha in texts]
    scored = _bm25_shares(asked, [Counter(_words(text)) for _, _, text in corpus])
    out: list[ImageHit] = []
    for (image_id, seq, text), share in sorted(zip(corpus, scored, strict=True), key=lambda p: -p[1]):
        if share < min_relevance or len(out) == limit:
            break
        out.append(ImageHit(str(image_id), f"image {image_id}, message #{seq}", text, share))
    return out


def _bm25_shares(asked: set[str], documents: list[Counter[str]]) -> list[float]:
    """Each description's BM25 as a share of what the question could score (retrieval.ranking)."""
    postings = Postings()
    for document in documents:
        postings.add(document)
    return [float(share) for share in postings.bm25(asked)]
