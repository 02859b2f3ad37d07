"""Compaction: summarise the oldest messages of B6 into B4 segments, write the transcript records, move the
boundary. plan.py (which messages), segments.py (segments and roll-ups), write.py and records.py (what a run
writes and shows), run.py (one run under the lock), failures.py, queue.py (the background task and its
queued mark, readiness), sweep.py (catch-up), rebuild.py (resummarize), replay.py (after an import)."""

from summaries.services.compaction.failures import compaction_failure_record, compaction_interrupted_record
from summaries.services.compaction.plan import Plan, compaction_plan, history_tokens
from summaries.services.compaction.queue import (
    compaction_due,
    compaction_queued,
    compaction_request,
    compaction_run_queued,
    compaction_settled,
    segments_replay_request,
)
from summaries.services.compaction.rebuild import segment_rebuild
from summaries.services.compaction.records import BOUNDARY_TEXT, segment_data
from summaries.services.compaction.replay import replay_pending, segments_replay
from summaries.services.compaction.run import compaction_run
from summaries.services.compaction.sweep import compaction_catch_up
from summaries.services.compaction.write import CompactionOutcome, CompactionStale, outcome_data

__all__ = [
    "BOUNDARY_TEXT",
    "CompactionOutcome",
    "CompactionStale",
    "Plan",
    "compaction_catch_up",
    "compaction_due",
    "compaction_failure_record",
    "compaction_interrupted_record",
    "compaction_plan",
    "compaction_queued",
    "compaction_request",
    "compaction_run",
    "compaction_run_queued",
    "compaction_settled",
    "history_tokens",
    "outcome_data",
    "replay_pending",
    "segment_data",
    "segment_rebuild",
    "segments_replay",
    "segments_replay_request",
]
