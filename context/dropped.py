"""What a context call left out or shortened: one frozen type per kind of drop, each serialised (data()) into
the response's `dropped` list."""

from dataclasses import dataclass
from typing import Any

from prefix_cache.provenance import AttachmentSource, ItemSource


@dataclass(frozen=True)
class Dropped:
    """Something a block gave way with, and the tokens that saved."""

    block: str
    reason: str
    tokens: int

    def data(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class DroppedItem(Dropped):
    """An item a block gave up (a summary segment, the session profile), or shortened (`truncated`, the task
    state)."""

    source: ItemSource
    truncated: bool = False

    def data(self) -> dict[str, Any]:
        data = {
            "block": self.block,
            "reason": self.reason,
            "source": self.source.data(),
            "tokens": self.tokens,
        }
        if self.truncated:
            data["truncated"] = True
        return data


@dataclass(frozen=True)
class HistoryCut(Dropped):
    """The older history a window cut left out (or never read): messages from_seq to to_seq."""

    from_seq: int
    to_seq: int
    messages: int

    def data(self) -> dict[str, Any]:
        return {
            "block": self.block,
            "reason": self.reason,
            "from_seq": self.from_seq,
            "to_seq": self.to_seq,
            "messages": self.messages,
            "tokens": self.tokens,
        }


@dataclass(frozen=True)
class ShortenedMessage(Dropped):
    """A message of the newest exchange kept with its head only; `tokens` is what was cut."""

    seq: int
    id: str

    def data(self) -> dict[str, Any]:
        return {
            "block": self.block,
            "reason": self.reason,
            "seq": self.seq,
            "id": self.id,
            "tokens": self.tokens,
        }


@dataclass(frozen=True)
class DroppedCount(Dropped):
    """Items left out together, counted: retrieval hits that did not fit or only repeated (with the best
    score among them), or attachments beyond the limits (never named)."""

    items: int
    best_score: float | None = None

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "block": self.block,
            "reason": self.reason,
            "items": self.items,
            "tokens": self.tokens,
        }
        if self.best_score is not None:
            data["best_score"] = self.best_score
        return data


@dataclass(frozen=True)
class DecayedAttachment(Dropped):
    """An attachment stepped down from the level it started at (`to` "dropped": left out)."""

    source: AttachmentSource
    from_level: str
    to_level: str
    shortened: bool

    def data(self) -> dict[str, Any]:
        return {
            "block": self.block,
            "reason": self.reason,
            **self.source.identity(),
            "from": self.from_level,
            "to": self.to_level,
            "shortened": self.shortened,
            "tokens": self.tokens,
        }
