"""Background embedding throughput: how many messages per second the local model turns into retrieval
vectors (conversations.embedding: passages of providers.passages, batches of similar length), on real chat
messages nobody here wrote (BEAM-128K, ../shared/data/beam-128k or --data).

Two sets from the same data: the user messages (short chat turns, a mean of ~80 tokens) and every message
(the assistant's long markdown replies included, ~530 tokens). Baseline in the same run: what the BM25
side of the index costs for the same messages (passages, terms, stems), the work an append triggers that is
not the model. Threads: onnxruntime intra-op threads per call (--threads 1 2). Models: the shipped model
as it is (its weights stored as int8, its products in float32) and the one Mnemo runs by default, derived from
it with int8 products (providers/quantize.py, MNEMO_EMBEDDINGS_INT8); for both, the time to embed each of
BEAM's questions alone on one thread, as a context call does.

Target (#14): >= 300 messages/s on 2 cores. Exits 1 when missed on the short-message set.
Run from the repository root: .venv/bin/python bench/embedding.py [--messages 400] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import django_setup, log, machine_header, percentile, render_table  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "beam-128k" / "beam-128k.jsonl"
TARGET = 300.0
MODELS = {False: "shipped (float32 products)", True: "int8 products (default)"}


def load(path: Path, count: int) -> tuple[list[str], list[str]]:
    messages = [m for line in path.open() if line.strip() for m in json.loads(line)["messages"]]
    user = [m["content"] for m in messages if m["role"] == "user"][:count]
    everything = [m["content"] for m in messages][:count]
    return user, everything


def load_questions(path: Path) -> list[str]:
    return [q["question"] for line in path.open() if line.strip() for q in json.loads(line)["questions"]]


def embedder_for(*, threads: int, int8: bool):
    from django.conf import settings

    from providers import embeddings

    settings.MNEMO_EMBEDDINGS_THREADS = threads
    settings.MNEMO_EMBEDDINGS_INT8 = int8
    embeddings._build.cache_clear()
    embedder = embeddings.embedder_status().embedder
    if embedder is None:
        raise SystemExit(f"no embedding model: {embeddings.embedder_status().reason}")
    embedder.embed(["warm up"])
    return embedder


def question_ms(questions: list[str], *, int8: bool) -> tuple[float, float]:
    """(p50, p95) ms to embed one question alone on one thread, over every question."""
    from context.retrieval import focused

    embedder = embedder_for(threads=1, int8=int8)
    times = []
    for question in questions:
        started = time.perf_counter()
        embedder.embed([focused(question)])
        times.append((time.perf_counter() - started) * 1000)
    return percentile(times, 50), percentile(times, 95)


def embed_rate(texts: list[str], threads: int, *, int8: bool) -> tuple[float, int]:
    """(messages per second, passages) for embedding every passage of every text."""
    from conversations.embedding import _embed_by_length
    from providers.passages import passages

    embedder = embedder_for(threads=threads, int8=int8)
    pieces = [p for text in texts for p in passages(text)]
    started = time.perf_counter()
    _embed_by_length(embedder, pieces)
    return len(texts) / (time.perf_counter() - started), len(pieces)


def index_rate(texts: list[str]) -> float:
    from memory.history_index import ConversationIndex

    index = ConversationIndex("bench")
    started = time.perf_counter()
    for seq, text in enumerate(texts, start=1):
        index._add(seq, seq, "user", text, 0, None, True)
    return len(texts) / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--messages", type=int, default=400, help="messages per set")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mnemo-bench-emb-") as scratch:
        django_setup(var_dir=Path(scratch))
        sets = dict(zip(("user messages", "all messages"), load(args.data, args.messages), strict=True))
        rows, short_best = [], 0.0
        for name, texts in sets.items():
            baseline = index_rate(texts)
            for threads in args.threads:
                for int8 in (False, True):
                    log(f"embedding {len(texts)} {name} with {threads} thread(s), {MODELS[int8]} ...")
                    rate, pieces = embed_rate(texts, threads, int8=int8)
                    if name == "user messages" and int8:
                        short_best = max(short_best, rate)
                    rows.append(
                        [
                            name,
                            MODELS[int8],
                            str(threads),
                            f"{pieces:,}",
                            f"{rate:,.1f}",
                            f"{baseline:,.0f}",
                            f"{rate / baseline:.3f}",
                        ]
                    )
        questions = load_questions(args.data)
        asked = [
            [MODELS[int8], *(f"{v:.2f}" for v in question_ms(questions, int8=int8))] for int8 in (False, True)
        ]
    print(machine_header("bench/embedding.py", f"data {args.data} ({args.messages} messages per set)"))
    head = [
        "messages",
        "model",
        "threads",
        "passages",
        "embedded msg/s",
        "BM25 indexing msg/s (baseline)",
        "ratio",
    ]
    print(render_table(head, rows))
    print(f"\n{len(questions)} questions, each embedded alone on one thread (as a context call does):")
    print(render_table(["model", "p50 ms", "p95 ms"], asked))
    verdict = "met" if short_best >= TARGET else "MISSED"
    print(
        f"target >= {TARGET:.0f} messages/s (user messages, the default model, best of the thread counts): "
        f"{short_best:,.1f} -> {verdict}"
    )
    return 0 if short_best >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
