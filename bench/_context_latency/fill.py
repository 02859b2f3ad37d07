"""Filling a conversation as one that grew to its size would be: messages from a realistic pool, and the
compaction records its last compactions would have left."""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bench._common import (
    MODEL,
    conversation_script,
    summary_text,
)
from conversations.embedding import message_vectors_fill
from conversations.models import Conversation, Message
from conversations.parts import parts_token_text
from providers.tokens import count_message, count_text
from summaries.conf import compaction_config
from summaries.models import SummarySegment
from summaries.selectors import END_SEQ_KEY
from summaries.services.compaction import BOUNDARY_TEXT, segments_replay

POOL_EXCHANGES = 200  # distinct exchanges the conversations are drawn from


INSERT_BATCH = 5_000


def message_pool(seed: str) -> list[list[dict[str, Any]]]:
    """Exchanges (lists of messages) with the token_count the write path would store for each message."""
    script = conversation_script(
        random.Random(f"{seed}-pool"), POOL_EXCHANGES, lambda s: count_text(s, model=MODEL)
    )
    pool = []
    for exchange in script:
        messages = []
        for m in exchange.messages:
            tokens = count_message(
                role=m["role"], content=m["content"], model=MODEL, extra_text=parts_token_text(m["parts"])
            )
            messages.append({**m, "token_count": tokens})
        pool.append(messages)
    return pool


def _exchange_start(messages: list[dict[str, Any]], index: int) -> int:
    """The nearest index at or before `index` where an exchange starts (a user message)."""
    while index > 0 and messages[index]["role"] != "user":
        index -= 1
    return index


def _back(messages: list[dict[str, Any]], end: int, tokens: int) -> int:
    """The exchange start from which messages[start:end] hold about `tokens`."""
    total, index = 0, end
    while index > 0 and total < tokens:
        index -= 1
        total += messages[index]["token_count"]
    return _exchange_start(messages, index)


def _forward(messages: list[dict[str, Any]], start: int, tokens: int) -> int:
    """The first exchange start at or after the point where messages[start:] reach `tokens`."""
    total, index = 0, start
    while index < len(messages) and total < tokens:
        total += messages[index]["token_count"]
        index += 1
    while index < len(messages) and messages[index]["role"] != "user":
        index += 1
    return index


@dataclass
class Segment:
    start: int  # message indexes (0-based) of the summarised range, inclusive
    end: int
    level: int
    built_from: str
    text: str = ""


def compaction_history(messages: list[dict[str, Any]], cfg: Any) -> dict[int, list[Segment]]:
    """Where the last compactions of a conversation that grew to `messages` left their records, as the
    tenant's compaction settings would have: each time the history since the boundary reached the background
    share of the history budget, all but the newest `keep` share was summarised, and older segments were
    rolled up. Returns {index of the message the records follow: segments written}. The history left after
    the last boundary sits mid-way between two compactions, so no call during the measurement compacts."""
    reached = cfg.background * cfg.history_budget  # B6 tokens when a background compaction starts
    kept = int(cfg.keep * reached)
    summarised = int(reached) - kept
    b6_start = _back(messages, len(messages), int(reached * (1 + cfg.keep) / 2))
    if b6_start == 0:
        return {}
    latest_start = _back(messages, b6_start, summarised)
    batches = {_forward(messages, b6_start, kept) - 1: [Segment(latest_start, b6_start - 1, 0, "raw")]}
    if latest_start > 0:
        # The compaction before it, which also rolled every older segment up into one.
        previous_start = _back(messages, latest_start, summarised)
        written = [Segment(previous_start, latest_start - 1, 0, "raw")]
        if previous_start > 0:
            written.insert(0, Segment(0, previous_start - 1, 1, "segments"))
        batches[_forward(messages, latest_start, kept) - 1] = written
    return dict(sorted(batches.items()))


class _Rows:
    """Messages written with bulk_create in batches, numbered as they are added."""

    def __init__(self, conversation: Any) -> None:
        self.conversation = conversation
        self.rows: list[Message] = []
        self.seq = 0
        self.created = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)

    def add(self, **fields: Any) -> int:
        self.seq += 1
        created_at = self.created + timedelta(seconds=20 * self.seq)
        self.rows.append(
            Message(conversation=self.conversation, seq=self.seq, created_at=created_at, **fields)
        )
        if len(self.rows) == INSERT_BATCH:
            self.flush()
        return self.seq

    def flush(self) -> None:
        if self.rows:
            Message.objects.bulk_create(self.rows)
            self.rows.clear()


def _count(text: str) -> int:
    return count_message(role="user", content=text, model=MODEL)


def _summary(rows: _Rows, segment: Segment, seqs: tuple[int, int], target: int, rng: random.Random) -> None:
    text = summary_text(rng, _count, target)
    rows.add(
        role=Message.Role.USER,
        kind=Message.Kind.COMPACT_SUMMARY,
        content=text,
        token_count=_count(text),
        metadata={
            "segment": {
                "id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "startSeq": seqs[0],
                "endSeq": seqs[1],
                "level": segment.level,
                "source": SummarySegment.Source.EXTRACTIVE,
                "builtFrom": segment.built_from,
                "templateVersion": "bench",
            },
            "supersedes": [],
        },
    )


def _records(
    rows: _Rows, messages: list[dict[str, Any]], written: list[Segment], seq_of: dict[int, int], cfg: Any,
    rng: random.Random,
) -> None:  # fmt: skip
    """What one compaction wrote after the message it followed: its boundary, then its segments."""
    last = seq_of[written[-1].end]
    rows.add(
        role=Message.Role.SYSTEM,
        kind=Message.Kind.COMPACT_BOUNDARY,
        content=BOUNDARY_TEXT,
        metadata={"trigger": "auto", "startSeq": seq_of[written[0].start], END_SEQ_KEY: last},
        idempotency_key=f"compaction:{last}",
    )
    for segment in written:
        source_tokens = sum(messages[i]["token_count"] for i in range(segment.start, segment.end + 1))
        # A segment as long as the summariser aims for; a roll-up a third of the summary budget.
        target = min(int(source_tokens * cfg.summary_ratio), cfg.summary_budget // 3)
        target = target if segment.level == 0 else cfg.summary_budget // 3
        _summary(rows, segment, (seq_of[segment.start], seq_of[segment.end]), target, rng)


def fill(
    conversation: Any, size: int, pool: list[list[dict[str, Any]]], rng: random.Random
) -> tuple[float, int]:
    """`size` messages, whole exchanges drawn from the pool (the last one cut to fit), with the compaction
    records (boundary + summaries) where compaction would have written them, in the transcript shape an
    import carries, and the summary segments rebuilt from them as after an import. Returns (seconds,
    segments written)."""
    started = time.perf_counter()
    messages: list[dict[str, Any]] = []
    while len(messages) < size:
        messages += rng.choice(pool)
    del messages[size:]
    cfg = compaction_config(conversation)
    batches = compaction_history(messages, cfg)
    rows = _Rows(conversation)
    seq_of: dict[int, int] = {}  # message index -> seq
    for index, m in enumerate(messages):
        seq_of[index] = rows.add(
            role=m["role"], content=m["content"], parts=m["parts"], token_count=m["token_count"]
        )
        if batches.get(index):
            _records(rows, messages, batches[index], seq_of, cfg, rng)
    rows.flush()
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=rows.seq)
    conversation.refresh_from_db()
    segments_replay(conversation=conversation)
    return time.perf_counter() - started, sum(len(b) for b in batches.values())


def embed_all(conversation: Any) -> float:
    """Retrieval vectors for every message, as the background task would have written them (the pool's
    texts repeat, so most re-use the vectors of the same text)."""
    started = time.perf_counter()
    message_vectors_fill(conversation_id=conversation.id)
    return time.perf_counter() - started
