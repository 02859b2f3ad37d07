"""Writes of the summaries app. compaction/: compaction, roll-ups, rebuilds, replay and the background queue;
summarise.py: one summary text (LLM → extractive → fact check). The monthly LLM budget it spends is the
tenant's (tenants.llm_budget)."""

from summaries.services.compaction import (
    CompactionOutcome,
    CompactionStale,
    compaction_catch_up,
    compaction_failure_record,
    compaction_interrupted_record,
    compaction_plan,
    compaction_queued,
    compaction_request,
    compaction_run,
    compaction_run_queued,
    history_tokens,
    outcome_data,
    segment_data,
    segment_rebuild,
    segments_replay,
)

__all__ = [
    "CompactionOutcome",
    "CompactionStale",
    "compaction_catch_up",
    "compaction_failure_record",
    "compaction_interrupted_record",
    "compaction_plan",
    "compaction_queued",
    "compaction_request",
    "compaction_run",
    "compaction_run_queued",
    "history_tokens",
    "outcome_data",
    "segment_data",
    "segment_rebuild",
    "segments_replay",
]
