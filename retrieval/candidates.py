"""What retrieval finds, typed: one frozen dataclass per kind of candidate, the scope a search runs in, and
the result of the one entry point (retrieval.find.candidates_find) with the degradations it met and the
background work it asks for. Placing candidates into a prompt is context's (context.retrieved)."""

from dataclasses import dataclass
from datetime import datetime

from conversations.models import Conversation
from providers.degradations import (
    Degradation as Degradation,  # a fallback a search took: the caller reports it
)


@dataclass(frozen=True)
class Scope:
    """Where a question is searched: the conversation (its tenant and end user name the other stores in
    scope) and how far into its history (None: all of it)."""

    conversation: Conversation
    before_seq: int | None = None


@dataclass(frozen=True)
class HistoryTurn:
    """A message of this conversation as its index knows it, with the text a prompt would show of it (its
    relative dates resolved, "yesterday (2023-05-07)")."""

    id: str
    seq: int
    position: int  # in the conversation's order: consecutive messages differ by one
    role: str
    speaker: str  # the name the client gave, else the role
    created_at: datetime
    token_count: int
    whole: bool  # one passage: shown whole, not as an excerpt
    text: str  # the whole message, or the excerpt of a long one (HistoryHit.span)


@dataclass(frozen=True)
class HistoryHit:
    """A message of this conversation the question finds, or the other half of such a hit's exchange
    (`partner`)."""

    turn: HistoryTurn
    span: tuple[int, int] | None  # the excerpt of a long message in its content (None: shown whole)
    relevance: float  # 0 to 1: the larger of its cosine with the question and its lexical share
    rank_score: float  # its place among the hits (fused RRF, weighed by the question's preferences)
    lexical: float
    similarity: float
    partner: "HistoryHit | None" = None  # the other half of its exchange, when that is not a hit itself


@dataclass(frozen=True)
class OtherConversationHit:
    """A message of another conversation of the same end user."""

    id: str
    seq: int
    role: str
    conversation_id: str
    conversation_title: str
    excerpt: str
    score: float
    speaker: str  # the name the client gave, else the role
    day: str  # the date it was said (YYYY-MM-DD)


@dataclass(frozen=True)
class MemoryHit:
    """An archival memory of the end user, scored on this conversation's scale (relevance)."""

    id: str
    kind: str
    content: str
    days: tuple[str, ...]  # the days the messages it was taken from were said
    relevance: float
    rank_score: float
    lexical: float  # its lexical share in this conversation's index
    similarity: float
    source_message_ids: tuple[str, ...]


@dataclass(frozen=True)
class ChunkHit:
    """A chunk of a document or of code in the conversation's scope."""

    chunk_id: int
    document_id: str
    citation: str  # `file "requirements.pdf", page 3` or `src/app.py:40-72 (render)`
    content: str
    relevance: float
    rank_score: float


@dataclass(frozen=True)
class ImageHit:
    """An image of the conversation whose description answers the question."""

    image_id: str
    citation: str
    description: str
    relevance: float


@dataclass(frozen=True)
class Found:
    """Every candidate for B5, each source in its own order (best first), what the search degraded to, and
    the background work it asks for (it writes nothing itself)."""

    history: tuple[HistoryHit, ...]
    answered: tuple[HistoryTurn, ...]  # the turns short hits answer (shown with them, never alone)
    memories: tuple[MemoryHit, ...]
    other_conversations: tuple[OtherConversationHit, ...]
    knowledge: tuple[ChunkHit | ImageHit, ...]
    degradations: tuple[Degradation, ...]
    vectors_missing: bool  # this conversation has messages without vectors: have them computed
