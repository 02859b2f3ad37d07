"""Background embedding throughput: how many messages per second the local model turns into retrieval
vectors (conversations.embedding: passages of providers.passages, batches of similar length), on real chat
messages nobody here wrote (../shared/data/beam-128k or --data).

Two sets from the same data: the user messages (short chat turns) and every message (the assistant's long
markdown replies included). Baseline in the same run: what the BM25
side of the index costs for the same messages (passages, terms, stems), the work an append triggers that is
not the model. Threads: onnxruntime intra-op threads per call (--threads 1 2). Models: the shipped model
as it is (its weights stored as int8, its products in float32) and the one Mnemo runs by default, derived from
it with int8 products (providers/quantize.py, MNEMO_EMBEDDINGS_INT8); for both, the time to embed each of
the data's questions alone on one thread, as a context call does.

Then the catch-up run an append queues (conversations.embedding.message_vectors_fill) on conversations of
--catch-up sizes whose messages all have vectors but the 3 newest: its time against the model's time for
those 3 alone (the baseline): what the run costs beyond the embedding itself as a conversation grows.

Target: >= 300 messages/s on 2 cores. Exits 1 when missed on the short-message set.
Run from the repository root: .venv/bin/python bench/embedding.py [--messages 400] [--threads 1 2]
[--catch-up 1000 10000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository takes its place.
ROOT = Path(__file__).resolve().parent.parent
sys.path[0] = str(ROOT)

from bench._common import machine_header, render_table  # noqa: E402
from bench._django import django_setup  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "beam-128k" / "beam-128k.jsonl"
TARGET = 300.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--messages", type=int, default=400, help="messages per set")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--catch-up", type=int, nargs="*", default=[1000, 10000], help="conversation sizes")
    return parser.parse_args()


def report(args: argparse.Namespace, figures: Any) -> str:
    head = ["messages", "model", "threads", "passages", "embedded msg/s"]
    head += ["BM25 indexing msg/s (baseline)", "ratio"]
    parts = [
        machine_header("bench/embedding.py", f"data {args.data} ({args.messages} messages per set)"),
        render_table(head, figures.rates),
        f"\n{figures.questions} questions, each embedded alone on one thread (as a context call does):",
        render_table(["model", "p50 ms", "p95 ms"], figures.asked),
    ]
    if figures.caught_up:
        new = figures.catch_up_new
        parts.append(f"\ncatch-up run after an append, {new} new user messages (p50 of 5 runs; SQLite):")
        head = ["conversation", "run ms", "the model alone ms (baseline)", "ratio"]
        parts.append(render_table(head, figures.caught_up))
    verdict = "met" if figures.short_best >= TARGET else "MISSED"
    parts.append(
        f"target >= {TARGET:.0f} messages/s (user messages, the default model, best of the thread counts): "
        f"{figures.short_best:,.1f} -> {verdict}"
    )
    return "\n".join(parts)


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-emb-") as scratch:
        django_setup(var_dir=Path(scratch))
        # Imported here: the benchmark's modules import the apps, which needs django_setup() to have run.
        from bench._embedding.measure import run

        figures = run(args)
    print(report(args, figures))
    return 0 if figures.short_best >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
