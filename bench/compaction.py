"""Compaction: planted facts kept and prompt tokens saved after five compactions, against a
summary-of-summary baseline measured in the same run.

A generated 1,000-message conversation (engineering chat with incidental numbers, file names and names as
noise) carries 100 planted facts, each stated once: 25 numbers, 25 file paths, 25 people's names and 25
decisions. The messages arrive in five chunks of 200; after each chunk the conversation is compacted with
the offline extractive summariser (no LLM), exactly as Mnemo does it (summaries.services.compaction_run:
segments from raw messages, fact check, roll-ups over the B4 budget). Then:

- facts kept: the share of planted facts whose text is still in B4 + B6 (the summary segments and the
  verbatim history after the last boundary), i.e. in what the model is shown;
- prompt tokens: the context pipeline's total for the next call, before any compaction (all 1,000
  messages) and after the five compactions;
- compaction time: wall time of each compaction (summarising, fact check, writing the records).

Baseline, same run, same chunks, same cut points and the same summary token spend: the classic
summary-of-summary, where each compaction summarises [previous summary + the newly compacted messages] into
one rolling summary with the same extractive summariser, sized to Mnemo's B4 tokens at that point, with no
fact check.

Run from the repository root:  .venv/bin/python bench/compaction.py
Options: --messages N (default 1000), --compactions K (default 5), --seed S. Uses a throwaway SQLite
database in a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._common import log  # noqa: E402
from bench._compaction.report import TARGET_FACTS, TARGET_SAVING, table  # noqa: E402
from bench._django import django_setup, scratch_dir  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--compactions", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.messages < 100 * args.compactions // 5 or args.compactions < 1:
        parser.error("use at least 20 messages per compaction")
    # Offline whatever the shell or a .env says: no LLM, tasks run eagerly in this process.
    os.environ.update(
        CELERY_TASK_ALWAYS_EAGER="true",
        LLM_BASE_URL="",
        LLM_API_KEY="",
        LLM_MODEL="",
        MNEMO_LOG_LEVEL="ERROR",
    )
    with scratch_dir("mnemo-bench-compaction-") as tmp:
        django_setup(var_dir=tmp)
        # Imported here: the benchmark's modules import the apps, which needs django_setup() to have run.
        from bench._compaction.measure import run

        log(f"generating {args.messages} messages and compacting {args.compactions} times …")
        result = run(args)
    print(table(result, args))
    met = result["mnemo"]["all"] >= TARGET_FACTS and 1 - result["after"] / result["before"] >= TARGET_SAVING
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
