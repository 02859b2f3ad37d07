"""Planning a compaction: how many tokens B6 holds, which of its oldest messages the next compaction
summarises, and the raw messages of a range (the only input a summary is ever made from)."""

import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Sum
from django.utils import timezone

from conversations.models import Conversation, Message
from summaries.conf import CompactionConfig
from summaries.selectors import boundary_last
from tenants.statements import FixedQuery


@dataclass
class Plan:
    cut: int  # B6 currently resumes after this seq
    start_seq: int
    end_seq: int  # the new cut
    b6_tokens: int
    range_tokens: int
    kept_tokens: int
    messages: int  # kind=message rows in the range
    kept: int
    skipped_incomplete: int


def history_tokens(conversation: Conversation, *, cut: int | None = None) -> int:
    """Tokens of B6: the messages after the last boundary (`cut`, when the caller has read it already)."""
    cut = boundary_last(conversation)[1] if cut is None else cut
    return _HISTORY_TOKENS.first(conversation_id=conversation.pk, cut=cut) or 0


# Summed on context calls whose history outgrew the window: a fixed statement (tenants.statements). Grouped by
# the conversation (one group, or no row when nothing follows the cut) so that the sum is a row it reads.
_HISTORY_TOKENS = FixedQuery(
    lambda conversation_id, cut: (
        Message.objects.filter(conversation_id=conversation_id, kind=Message.Kind.MESSAGE, seq__gt=cut)
        .order_by()
        .values("conversation_id")
        .annotate(tokens=Sum("token_count"))
        .values_list("tokens", flat=True)
    ),
    conversation_id=uuid.UUID(int=0xC0DF),
    cut=7_123_456_789_019,
)


def compaction_plan(
    conversation: Conversation, cfg: CompactionConfig, *, keep: float | None = None
) -> Plan | None:
    """Which messages the next compaction summarises: the oldest of B6, keeping the newest `keep` share by
    tokens. The kept part never starts with a tool result (its call stays with it), starts at a user message
    when that keeps at most half of B6, and the range stops before an incomplete message that may still be
    streaming. None when there is nothing worth compacting."""
    keep = cfg.keep if keep is None else keep
    cut = boundary_last(conversation)[1]
    rows = list(
        Message.objects.filter(conversation=conversation, kind=Message.Kind.MESSAGE, seq__gt=cut)
        .order_by("seq")
        .values_list("seq", "token_count", "role", "completed", "created_at")
    )
    if len(rows) < 2:
        return None
    split = _split(rows, keep)
    grace = timezone.now() - timedelta(seconds=cfg.incomplete_grace_seconds)
    for index in range(split):
        _, _, _, completed, created_at = rows[index]
        if not completed and created_at > grace:
            split = index
            break
    summarised = rows[:split]
    if not summarised or not any(r[3] for r in summarised):
        return None
    return Plan(
        cut=cut,
        start_seq=summarised[0][0],
        end_seq=summarised[-1][0],
        b6_tokens=sum(r[1] for r in rows),
        range_tokens=sum(r[1] for r in summarised),
        kept_tokens=sum(r[1] for r in rows[split:]),
        messages=len(summarised),
        kept=len(rows) - split,
        skipped_incomplete=sum(1 for r in summarised if not r[3]),
    )


def _split(rows: list[tuple], keep: float) -> int:
    """Where the kept part of B6 starts: the newest `keep` share by tokens, moved back over tool results and
    to the user message that opens its exchange when that keeps at most half."""
    total = sum(r[1] for r in rows)
    kept = 0
    split = len(rows)
    while split > 0 and kept < total * keep:
        split -= 1
        kept += rows[split][1]
    split = min(max(1, split), len(rows) - 1)  # keep at least the newest message, summarise at least one
    while split > 0 and rows[split][2] == Message.Role.TOOL:
        split -= 1
    if split > 0 and rows[split][2] != Message.Role.USER:
        # Prefer to keep whole exchanges: start at the user message before, if that keeps at most half.
        index, kept_if = split, sum(r[1] for r in rows[split:])
        while index > 1:
            index -= 1
            kept_if += rows[index][1]
            if kept_if > total * 0.5:
                break
            if rows[index][2] == Message.Role.USER:
                split = index
                break
    return split


def raw_messages(conversation: Conversation, start_seq: int, end_seq: int) -> list[Message]:
    """The completed raw messages of a range: the only input a summary is ever made from."""
    return list(
        Message.objects.filter(
            conversation=conversation,
            kind=Message.Kind.MESSAGE,
            completed=True,
            seq__gte=start_seq,
            seq__lte=end_seq,
        ).order_by("seq")
    )


def range_tokens(conversation: Conversation, start: int, end: int) -> int:
    """Tokens of the completed raw messages of a range."""
    return (
        Message.objects.filter(
            conversation=conversation, kind=Message.Kind.MESSAGE, completed=True, seq__gte=start, seq__lte=end
        ).aggregate(tokens=Sum("token_count"))["tokens"]
        or 0
    )


def chunks(messages: list[Message], limit: int) -> list[list[Message]]:
    """The messages in order, cut into runs of at most `limit` tokens (a longer message is a run alone)."""
    runs: list[list[Message]] = [[]]
    used = 0
    for message in messages:
        if runs[-1] and used + message.token_count > limit:
            runs.append([])
            used = 0
        runs[-1].append(message)
        used += message.token_count
    return [r for r in runs if r]
