"""One compaction run under the conversation's lock: plan, summarise the range into segments (roll-ups when
B4 outgrows its budget, a truncation segment when no summary could be made), write them; and the records of
a run that failed or whose worker died."""

import logging
import time

from django.db import transaction
from django.utils import timezone

from conversations.models import Conversation
from summaries.conf import CompactionConfig, compaction_config_requested
from summaries.locks import compaction_lock
from summaries.models import CompactionState, SummarySegment
from summaries.selectors import segments_live
from summaries.services.compaction.failures import compaction_failure_record, compaction_interrupted_record
from summaries.services.compaction.plan import Plan, chunks, compaction_plan, raw_messages
from summaries.services.compaction.records import publish
from summaries.services.compaction.replay import replay_pending, segments_replay
from summaries.services.compaction.segments import rollups_make, segment_build, summarise_raw
from summaries.services.compaction.write import CompactionOutcome, CompactionStale, RunResult, result_write
from summaries.services.summarise import named_attachments, target_tokens_for

logger = logging.getLogger(__name__)


def compaction_run(
    *,
    conversation: Conversation,
    trigger: str,
    instructions: str = "",
    sync: bool = True,
    min_tokens: int = 0,
    will_retry: bool = False,
) -> CompactionOutcome | None:
    """Compact now, under the conversation's lock (LockBusy when another run holds it). None when there is
    nothing to compact or B6 holds fewer than `min_tokens`; CompactionStale when another run moved the
    boundary first. A failure is recorded and published (compaction.failed) before it propagates."""
    cfg = compaction_config_requested(conversation)
    with compaction_lock(conversation.pk, ttl=cfg.lock_ttl):
        # Holding the lock, a run still marked as running is one whose worker died.
        compaction_interrupted_record(conversation=conversation, trigger=trigger)
        plan = compaction_plan(conversation, cfg)
        if plan is None or plan.b6_tokens < min_tokens:
            return None
        # An imported transcript's segments are made before a run adds its own: once a conversation has
        # segments, its summary records are never replayed.
        if replay_pending(conversation, cut=plan.cut):
            segments_replay(conversation=conversation, cut=plan.cut)
        # Committed before the run (unless a caller's transaction holds it), so a killed worker leaves it.
        CompactionState.objects.get_or_create(conversation=conversation)
        marked = CompactionState.objects.filter(pk=conversation.pk)
        marked.update(running_since=timezone.now())
        try:
            return _run(conversation, plan, cfg, trigger=trigger, instructions=instructions, sync=sync)
        except CompactionStale:
            raise
        except Exception as exc:
            compaction_failure_record(
                conversation=conversation, trigger=trigger, exc=exc, will_retry=will_retry
            )
            raise
        finally:
            marked.update(running_since=None)


def _run(
    conversation: Conversation,
    plan: Plan,
    cfg: CompactionConfig,
    *,
    trigger: str,
    instructions: str = "",
    sync: bool,
) -> CompactionOutcome:
    """Summarise the plan's range into new segments (roll-ups when B4 outgrows its budget; a truncation
    segment when summarising fails), then write the boundary and summary records, the segments and the
    compaction state in one transaction and announce them on commit."""
    started = time.perf_counter()
    live_before = segments_live(conversation=conversation)
    tokens_before = sum(s.token_count for s in live_before) + plan.b6_tokens
    publish(
        conversation,
        "compaction.started",
        {
            "trigger": trigger,
            "mode": "sync" if sync else "background",
            "tokens_before": tokens_before,
            "start_seq": plan.start_seq,
            "end_seq": plan.end_seq,
        },
    )
    degradations: list[dict[str, str]] = []
    try:
        new = _summarised(
            conversation, plan, cfg, trigger, instructions, sync=sync, degradations=degradations
        )
        rollups, replaced = rollups_make(conversation, [*live_before, *new], cfg, sync=sync)
    except Exception as exc:
        # The offline path failed (a bug, not an outage): keep the newest part of the history and leave the
        # rest out of the prompt, recorded as a truncation segment that `resummarize` can turn into a summary.
        logger.exception("summarising %s failed; falling back to truncation", conversation.id)
        plan, new = _truncated(conversation, plan, cfg, exc, trigger=trigger, degradations=degradations)
        rollups, replaced = [], []
    result = RunResult(
        plan=plan,
        trigger=trigger,
        live_before=live_before,
        new=new,
        rollups=rollups,
        replaced=replaced,
        tokens_before=tokens_before,
        attachments=named_attachments(raw_messages(conversation, plan.start_seq, plan.end_seq)),
        degradations=degradations,
    )
    with transaction.atomic():
        outcome = result_write(conversation, result, started=started)
    for d in degradations:
        logger.warning("compaction of %s degraded (%s): %s", conversation.id, d["code"], d["message"])
    return outcome


def _summarised(
    conversation: Conversation,
    plan: Plan,
    cfg: CompactionConfig,
    trigger: str,
    instructions: str,
    *,
    sync: bool,
    degradations: list[dict[str, str]],
) -> list[SummarySegment]:
    """One level-0 segment per chunk of the range that fits the summariser's input (unsaved); the summaries'
    degradations are added to `degradations`."""
    new = []
    parts = chunks(raw_messages(conversation, plan.start_seq, plan.end_seq), cfg.max_input_tokens)
    for index, chunk in enumerate(parts):
        input_tokens = sum(m.token_count for m in chunk)
        summary = summarise_raw(
            conversation,
            chunk,
            target_tokens=target_tokens_for(input_tokens, cfg),
            cfg=cfg,
            instructions=instructions,
            sync=sync,
        )
        degradations += [d for d in summary.degradations if d not in degradations]
        new.append(
            segment_build(
                conversation,
                start_seq=plan.start_seq if index == 0 else chunk[0].seq,
                end_seq=plan.end_seq if index == len(parts) - 1 else chunk[-1].seq,
                level=0,
                summary=summary,
                built_from=SummarySegment.BuiltFrom.RAW,
                extra={"trigger": trigger, **({"instructions": instructions} if instructions else {})},
            )
        )
    return new


def _truncated(
    conversation: Conversation,
    plan: Plan,
    cfg: CompactionConfig,
    exc: Exception,
    *,
    trigger: str,
    degradations: list[dict[str, str]],
) -> tuple[Plan, list[SummarySegment]]:
    """The fallback when no summary could be made: the plan that keeps the newest cfg.fallback_keep of the
    history, and one truncation segment for what it leaves out of the prompt."""
    degradations.append(
        {
            "code": "summary_failed",
            "message": f"No summary could be made ({type(exc).__name__}): the newest "
            f"{round(cfg.fallback_keep * 100)} % of the history is kept, the rest left out of the "
            "prompt.",
        }
    )
    plan = compaction_plan(conversation, cfg, keep=cfg.fallback_keep) or plan
    segment = segment_build(
        conversation,
        start_seq=plan.start_seq,
        end_seq=plan.end_seq,
        level=0,
        summary=None,
        built_from=SummarySegment.BuiltFrom.RAW,
        extra={"trigger": trigger},
    )
    return plan, [segment]
