"""Writes of the summaries app. compaction.py: compaction, roll-ups, rebuilds, replay and the background
queue; summarise.py: one summary text (LLM → extractive → fact check); llm_budget.py: the monthly ledger."""

from summaries.services.compaction import (
    CompactionOutcome,
    CompactionStale,
    compaction_catch_up,
    compaction_failure_record,
    compaction_interrupted_record,
    compaction_plan,
    compaction_request,
    compaction_run,
    compaction_run_queued,
    history_tokens,
    outcome_data,
    segment_data,
    segment_rebuild,
    segments_replay,
)
from summaries.services.llm_budget import llm_budget_left, llm_tokens_used, llm_usage_record

__all__ = [
    "CompactionOutcome",
    "CompactionStale",
    "compaction_catch_up",
    "compaction_failure_record",
    "compaction_interrupted_record",
    "compaction_plan",
    "compaction_request",
    "compaction_run",
    "compaction_run_queued",
    "history_tokens",
    "llm_budget_left",
    "llm_tokens_used",
    "llm_usage_record",
    "outcome_data",
    "segment_data",
    "segment_rebuild",
    "segments_replay",
]
