"""Reads: where the history after the last compaction boundary starts, the live summary segments (B4), and
the rendering of a segment into the prompt."""

import uuid
from typing import Any

from django.db.models import F, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.lookups import Exact

from conversations.models import Conversation, Message
from summaries.models import CompactionState, SummarySegment
from summaries.prompts import TEMPLATE_VERSION
from tenants.models import Tenant
from tenants.scoping import access_object
from tenants.statements import FixedQuery, Read

# compactMetadata key of a boundary: the last seq the compaction summarised. The boundary itself is
# appended at the end of the transcript (seq is assigned on write), so B6 resumes after this seq, not after
# the boundary's own; a boundary without it (a seed-style file) starts B6 after itself.
END_SEQ_KEY = "endSeq"


# Both read on every context call: fixed statements (tenants.statements). The boundary's kind is a literal in
# the SQL, not a parameter: a prepared statement's generic plan cannot use the partial index on boundaries
# (messages.message_boundary_seq) for a kind it does not know, and PostgreSQL chose it anyway (it expects a
# boundary every few rows), walking a conversation without one back to its first message: a cost that grows
# with the conversation where the index reads one row.
_BOUNDARY_SQL = f"'{Message.Kind.COMPACT_BOUNDARY.value}'"
_LAST_BOUNDARY = FixedQuery(
    lambda conversation_id: (
        Message.objects.filter(Exact(F("kind"), RawSQL(_BOUNDARY_SQL, ())), conversation_id=conversation_id)  # noqa: S611
        .order_by("-seq")
        .values_list("seq", "metadata")[:1]
    ),
    conversation_id=uuid.uuid4(),
)
_LIVE_SEGMENTS = FixedQuery(
    lambda conversation_id: SummarySegment.objects.filter(
        conversation_id=conversation_id, superseded_by__isnull=True
    ).order_by("start_seq", "level"),
    conversation_id=uuid.uuid4(),
)


def history_start_reads(conversation: Conversation) -> list[Read]:
    """The boundary and live segments reads of a context call, for reading them ahead (tenants.statements)."""
    return [
        (_LAST_BOUNDARY, {"conversation_id": conversation.pk}),
        (_LIVE_SEGMENTS, {"conversation_id": conversation.pk}),
    ]


def boundary_last(conversation: Conversation | Any) -> tuple[int, int]:
    """(seq of the last compact_boundary message, the seq B6 resumes after); (0, 0) before the first."""
    row = _LAST_BOUNDARY.first(conversation_id=conversation)
    if row is None:
        return 0, 0
    seq, metadata = row
    end = metadata.get(END_SEQ_KEY) if isinstance(metadata, dict) else None
    if isinstance(end, int) and not isinstance(end, bool) and 0 <= end <= seq:
        return seq, end
    return seq, seq


def history_start_seq(conversation: Conversation | Any) -> int:
    """B6 holds the messages with a seq greater than this."""
    return boundary_last(conversation)[1]


def segments_live(*, conversation: Conversation | Any) -> list[SummarySegment]:
    """The segments B4 shows, oldest first. Superseded segments (rolled up or rebuilt) are left out."""
    segments: list[SummarySegment] = _LIVE_SEGMENTS.run(conversation_id=conversation)
    return segments


def segment_prompt_text(segment: SummarySegment) -> str:
    """A segment as B4 shows it: its seq range and the days it covers, then its text. A pure function of the
    stored row."""
    first, last = (segment.metadata or {}).get("first_day"), (segment.metadata or {}).get("last_day")
    days = "" if not first else f", {first}" if first == last else f", {first} to {last}"
    return f"[Messages {segment.start_seq}–{segment.end_seq}{days}]\n{segment.text}"


def segment_source(segment: SummarySegment) -> dict[str, Any]:
    return {
        "kind": "summary_segment",
        "id": str(segment.id),
        "start_seq": segment.start_seq,
        "end_seq": segment.end_seq,
        "level": segment.level,
        "source": segment.source,
    }


def access_segment(*, tenant: Tenant, segment_id: object) -> SummarySegment:
    return access_object(
        SummarySegment.objects.select_related("conversation"), pk=segment_id, conversation__tenant=tenant
    )


def segments_to_rebuild(
    *,
    tenant: Tenant | None = None,
    conversation_id: uuid.UUID | str | None = None,
    only_outdated: bool = True,
) -> QuerySet[SummarySegment]:
    """Live segments made with an older template or by truncation (all live ones with only_outdated=False),
    in rebuild order."""
    qs = SummarySegment.objects.filter(superseded_by__isnull=True).select_related("conversation__tenant")
    if tenant is not None:
        qs = qs.filter(conversation__tenant=tenant)
    if conversation_id is not None:
        qs = qs.filter(conversation_id=conversation_id)
    if only_outdated:
        qs = qs.filter(~Q(template_version=TEMPLATE_VERSION) | Q(source=SummarySegment.Source.TRUNCATION))
    return qs.order_by("conversation_id", "start_seq", "level")


def compaction_status(conversation: Conversation | Any) -> dict[str, Any]:
    """The conversation's compaction as the API and the admin show it: status (running, queued, failed —
    the catch-up sweep retries it — or idle), counts, and the last error until a run succeeds."""
    state = CompactionState.objects.filter(pk=conversation.pk).first() or CompactionState()

    def time(value: Any) -> str | None:
        return value.isoformat().replace("+00:00", "Z") if value else None

    return {
        "status": state.status,
        "compactions": state.compactions,
        "failures": state.failures,
        "last_run_at": time(state.last_run_at),
        "last_source": state.last_source or None,
        "last_failed_at": time(state.last_failed_at),
        "last_error": state.last_error or None,
        "running_since": time(state.running_since),
        "queued_at": time(state.queued_at),
        "history_budget": state.history_budget,
        "summary_budget": state.summary_budget,
    }
