"""Where each Item of a prompt came from: one frozen type per kind of source, each serialised (data()) into
the `items` the context response lists per block. Rendering reads only an Item's text; the pipeline places
by these types (isinstance), and the JSON keeps the `kind` strings the API documents."""

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ItemSource:
    """The provenance of one Item; data() is its entry in the response's `items` (without its tokens)."""

    def data(self) -> dict[str, Any]:
        raise NotImplementedError


# --- the system message's blocks and the per-request state ------------------------------------------------


@dataclass(frozen=True)
class AgentProfileSource(ItemSource):
    """B1: the agent profile whose role and policy the prompt starts with."""

    id: str
    version: int

    def data(self) -> dict[str, Any]:
        return {"kind": "agent_profile", "id": self.id, "version": self.version}


@dataclass(frozen=True)
class CoreMemorySource(ItemSource):
    """B2a: a core-memory block at the version of the conversation's snapshot."""

    label: str
    version: int

    def data(self) -> dict[str, Any]:
        return {"kind": "core_memory", "label": self.label, "version": self.version}


@dataclass(frozen=True)
class MemoryUpdateSource(ItemSource):
    """A core-memory block edited since the snapshot, shown in the current message."""

    label: str
    version: int

    def data(self) -> dict[str, Any]:
        return {
            "kind": "memory_update",
            "target": "core_memory",
            "label": self.label,
            "version": self.version,
        }


@dataclass(frozen=True)
class SummarySegmentSource(ItemSource):
    """B4: a summary segment of the messages start_seq to end_seq; `source` is what wrote it (llm,
    extractive, truncation)."""

    id: str
    start_seq: int
    end_seq: int
    level: int
    source: str

    def data(self) -> dict[str, Any]:
        return {
            "kind": "summary_segment",
            "id": self.id,
            "start_seq": self.start_seq,
            "end_seq": self.end_seq,
            "level": self.level,
            "source": self.source,
        }


@dataclass(frozen=True)
class TaskStateSource(ItemSource):
    """B3: the task state at this epoch, with the number of events applied over its base."""

    epoch: int
    events: int

    def data(self) -> dict[str, Any]:
        return {"kind": "task_state", "epoch": self.epoch, "events": self.events}


@dataclass(frozen=True)
class SessionProfileSource(ItemSource):
    """B2b: the session profile at this epoch of the task state."""

    epoch: int

    def data(self) -> dict[str, Any]:
        return {"kind": "session_profile", "epoch": self.epoch}


# --- attachments ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttachmentSource(ItemSource):
    """An attachment sent with the request (always P0); `level` is the text it is shown at, once placed."""

    name: str
    priority: str
    level: str | None = field(default=None, kw_only=True)

    def identity(self) -> dict[str, Any]:
        """What names it in a `dropped` entry."""
        return {"name": self.name, "priority": self.priority}

    def data(self) -> dict[str, Any]:
        return self._placed({"kind": "attachment", **self.identity()})

    def _placed(self, data: dict[str, Any]) -> dict[str, Any]:
        if self.level is not None:
            data["level"] = self.level
        return data


@dataclass(frozen=True)
class StoredAttachmentSource(AttachmentSource):
    """A stored attachment (a document or an image) with why it is offered; `described` tells, for an image,
    who described it (None for a document)."""

    attachment: str
    id: str
    reason: str
    described: str | None = None

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "attachment": self.attachment, "id": self.id}

    def data(self) -> dict[str, Any]:
        data = {"kind": "attachment", **self.identity(), "reason": self.reason}
        if self.described is not None:
            data["described"] = self.described
        return self._placed(data)


# --- retrieval (B5) ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetrievedSource(ItemSource):
    """A retrieval candidate: its id, its relevance on the conversation's scale (`score`), and which query
    found it (the user's words, rules or an LLM; set once every candidate is in)."""

    id: str
    score: float
    query: str | None = field(default=None, kw_only=True)

    def _found_by(self, data: dict[str, Any]) -> dict[str, Any]:
        if self.query is not None:
            data["query"] = self.query
        return data


@dataclass(frozen=True)
class MessageSource(RetrievedSource):
    """A message, of this conversation or another of the end user's (`kind` "message" in the JSON)."""

    seq: int


@dataclass(frozen=True)
class MessageHitSource(MessageSource):
    """A message of this conversation the question finds (whole, or its excerpt `span`), or the exchange
    partner of such a hit (`neighbour_of` the hit's seq)."""

    created_at: str
    rank_score: float
    lexical: float
    similarity: float
    neighbour_of: int | None = None
    span: tuple[int, int] | None = None

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": "message",
            "id": self.id,
            "seq": self.seq,
            "created_at": self.created_at,
            "score": self.score,
            "rank_score": self.rank_score,
            "lexical": self.lexical,
            "similarity": self.similarity,
        }
        if self.neighbour_of is not None:
            data["neighbour_of"] = self.neighbour_of
        if self.span is not None:
            data["span"] = list(self.span)
        return self._found_by(data)


@dataclass(frozen=True)
class TurnGroupSource(MessageSource):
    """Consecutive turns under one label, scored as its best hit (`id`, `score` and the hit's other scores);
    `seq` and `created_at` are the first turn's."""

    created_at: str
    rank_score: float
    lexical: float
    similarity: float
    seqs: tuple[int, ...]
    ids: tuple[str, ...]

    def data(self) -> dict[str, Any]:
        return self._found_by(
            {
                "id": self.id,
                "kind": "message",
                "seq": self.seq,
                "created_at": self.created_at,
                "score": self.score,
                "rank_score": self.rank_score,
                "lexical": self.lexical,
                "similarity": self.similarity,
                "seqs": list(self.seqs),
                "ids": list(self.ids),
            }
        )


@dataclass(frozen=True)
class OtherConversationSource(MessageSource):
    """A message of another conversation of the same end user."""

    conversation_id: str

    def data(self) -> dict[str, Any]:
        return self._found_by(
            {
                "kind": "message",
                "id": self.id,
                "seq": self.seq,
                "conversation_id": self.conversation_id,
                "score": self.score,
            }
        )


@dataclass(frozen=True)
class ArchivalSource(RetrievedSource):
    """An archival memory of the end user, with the messages it was taken from."""

    rank_score: float
    lexical: float
    similarity: float
    source_message_ids: tuple[str, ...]

    def data(self) -> dict[str, Any]:
        return self._found_by(
            {
                "kind": "archival",
                "id": self.id,
                "score": self.score,
                "rank_score": self.rank_score,
                "lexical": self.lexical,
                "similarity": self.similarity,
                "source_message_ids": list(self.source_message_ids),
            }
        )


@dataclass(frozen=True)
class ChunkSource(RetrievedSource):
    """A chunk of a document or of code in scope (`id` is "chunk:<id>")."""

    document: str
    citation: str
    rank_score: float

    def data(self) -> dict[str, Any]:
        return self._found_by(
            {
                "kind": "knowledge",
                "id": self.id,
                "document": self.document,
                "citation": self.citation,
                "score": self.score,
                "rank_score": self.rank_score,
            }
        )


@dataclass(frozen=True)
class ImageDescriptionSource(RetrievedSource):
    """The description of an image of the conversation (`id` is "image:<image id>")."""

    image: str
    citation: str

    def data(self) -> dict[str, Any]:
        return self._found_by(
            {
                "kind": "knowledge",
                "id": self.id,
                "image": self.image,
                "citation": self.citation,
                "score": self.score,
            }
        )
