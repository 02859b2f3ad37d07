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

Then the catch-up run an append queues (conversations.embedding.message_vectors_fill) on conversations of
--catch-up sizes whose messages all have vectors but the 3 newest: its time against the model's time for
those 3 alone (the baseline): what the run costs beyond the embedding itself as a conversation grows.

Target (#14): >= 300 messages/s on 2 cores. Exits 1 when missed on the short-message set.
Run from the repository root: .venv/bin/python bench/embedding.py [--messages 400] [--threads 1 2]
[--catch-up 1000 10000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import log, machine_header, percentile, render_table  # noqa: E402
from bench._django import django_setup  # noqa: E402

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


CATCH_UP_NEW = 3


def catch_up_row(texts: list[str], size: int) -> list[str]:
    """One conversation of `size` messages (texts cycled; vectors written directly for all but the newest
    CATCH_UP_NEW): p50 of 5 catch-up runs, each after those vectors were deleted again, and of the model
    embedding the same messages' passages alone."""
    import numpy as np

    from conversations.embedding import _embed_by_length, message_vectors_fill
    from conversations.models import Message, MessageVector
    from conversations.services import conversation_create
    from providers.embeddings import embedder_status
    from providers.passages import passage_spans
    from tenants.services import tenant_create

    embedder = embedder_status().embedder
    tenant, _ = tenant_create(slug=f"bench-catch-up-{size}")
    conversation = conversation_create(tenant=tenant, model="gpt-4o")
    items = [
        Message(
            conversation=conversation, seq=n + 1, role="user", content=texts[n % len(texts)], token_count=1
        )
        for n in range(size)
    ]
    messages = Message.objects.bulk_create(items, batch_size=2000)
    vector = np.zeros(embedder.dimension, dtype=np.float32).tobytes()
    rows = [
        MessageVector(message=m, conversation=conversation, seq=m.seq, model=embedder.name, spans=[],
                      dimension=embedder.dimension, vectors=vector, content_sha256=f"bench-{m.seq}")
        for m in messages[:-CATCH_UP_NEW]
    ]  # fmt: skip
    MessageVector.objects.bulk_create(rows, batch_size=2000)
    newest = [m.content for m in messages[-CATCH_UP_NEW:]]
    passages = [text[a:b] for text in newest for a, b in passage_spans(text)]
    runs, alone = [], []
    for _ in range(5):
        MessageVector.objects.filter(conversation=conversation, seq__gt=size - CATCH_UP_NEW).delete()
        started = time.perf_counter()
        assert message_vectors_fill(conversation_id=conversation.pk) == CATCH_UP_NEW
        runs.append(time.perf_counter() - started)
        started = time.perf_counter()
        _embed_by_length(embedder, passages)
        alone.append(time.perf_counter() - started)
    run_ms, alone_ms = percentile(runs, 50) * 1e3, percentile(alone, 50) * 1e3
    return [f"{size:,}", f"{run_ms:.1f}", f"{alone_ms:.1f}", f"{run_ms / alone_ms:.2f}"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--messages", type=int, default=400, help="messages per set")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--catch-up", type=int, nargs="*", default=[1000, 10000], help="conversation sizes")
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
        caught_up = [catch_up_row(sets["user messages"], size) for size in args.catch_up]
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
    if caught_up:
        print(f"\ncatch-up run after an append, {CATCH_UP_NEW} new user messages (p50 of 5 runs; SQLite):")
        head = ["conversation", "run ms", "the model alone ms (baseline)", "ratio"]
        print(render_table(head, caught_up))
    verdict = "met" if short_best >= TARGET else "MISSED"
    print(
        f"target >= {TARGET:.0f} messages/s (user messages, the default model, best of the thread counts): "
        f"{short_best:,.1f} -> {verdict}"
    )
    return 0 if short_best >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
