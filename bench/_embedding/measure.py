"""What the embedding benchmark measures: embedding rates against BM25 indexing, one question's embedding, and
the catch-up run after an append.

Imported once django_setup() has run: it imports the apps at module level.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from django.conf import settings

from bench._common import log, percentile
from conversations.embedding import message_vectors_fill
from conversations.models import Message, MessageVector
from conversations.services import conversation_create
from providers import embeddings
from providers.embeddings import embed_by_length, embedder_status
from providers.passages import passage_spans, passages
from retrieval.history import ConversationIndex
from retrieval.questions import focused
from tenants.services import tenant_create

MODELS = {False: "shipped (float32 products)", True: "int8 products (default)"}


def load(path: Path, count: int) -> tuple[list[str], list[str]]:
    messages = [m for line in path.open() if line.strip() for m in json.loads(line)["messages"]]
    user = [m["content"] for m in messages if m["role"] == "user"][:count]
    everything = [m["content"] for m in messages][:count]
    return user, everything


def load_questions(path: Path) -> list[str]:
    return [q["question"] for line in path.open() if line.strip() for q in json.loads(line)["questions"]]


def embedder_for(*, threads: int, int8: bool):
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
    embedder = embedder_for(threads=1, int8=int8)
    times = []
    for question in questions:
        started = time.perf_counter()
        embedder.embed([focused(question)])
        times.append((time.perf_counter() - started) * 1000)
    return percentile(times, 50), percentile(times, 95)


def embed_rate(texts: list[str], threads: int, *, int8: bool) -> tuple[float, int]:
    """(messages per second, passages) for embedding every passage of every text."""
    embedder = embedder_for(threads=threads, int8=int8)
    pieces = [p for text in texts for p in passages(text)]
    started = time.perf_counter()
    embed_by_length(embedder, pieces)
    return len(texts) / (time.perf_counter() - started), len(pieces)


def index_rate(texts: list[str]) -> float:
    index = ConversationIndex("bench")
    created = datetime.now(UTC)  # relative dates in the texts are resolved against it, as on an append
    started = time.perf_counter()
    for seq, text in enumerate(texts, start=1):
        index._add(seq, seq, "user", "", text, 0, created, True)
    return len(texts) / (time.perf_counter() - started)


CATCH_UP_NEW = 3


def catch_up_row(texts: list[str], size: int) -> list[str]:
    """One conversation of `size` messages (texts cycled; vectors written directly for all but the newest
    CATCH_UP_NEW): p50 of 5 catch-up runs, each after those vectors were deleted again, and of the model
    embedding the same messages' passages alone."""
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
    newest_passages = [text[a:b] for text in newest for a, b in passage_spans(text)]
    runs, alone = [], []
    for _ in range(5):
        MessageVector.objects.filter(conversation=conversation, seq__gt=size - CATCH_UP_NEW).delete()
        started = time.perf_counter()
        assert message_vectors_fill(conversation_id=conversation.pk) == CATCH_UP_NEW
        runs.append(time.perf_counter() - started)
        started = time.perf_counter()
        embed_by_length(embedder, newest_passages)
        alone.append(time.perf_counter() - started)
    run_ms, alone_ms = percentile(runs, 50) * 1e3, percentile(alone, 50) * 1e3
    return [f"{size:,}", f"{run_ms:.1f}", f"{alone_ms:.1f}", f"{run_ms / alone_ms:.2f}"]


@dataclass
class Figures:
    rates: list[list[str]]  # per set, thread count and model: rate against the BM25 indexing baseline
    short_best: float  # user messages, the default model, best of the thread counts
    caught_up: list[list[str]]
    questions: int
    asked: list[list[str]]
    catch_up_new: int = CATCH_UP_NEW


def rate_rows(name: str, texts: list[str], threads: list[int]) -> tuple[list[list[str]], float]:
    baseline = index_rate(texts)
    rows, best = [], 0.0
    for count in threads:
        for int8 in (False, True):
            log(f"embedding {len(texts)} {name} with {count} thread(s), {MODELS[int8]} ...")
            rate, pieces = embed_rate(texts, count, int8=int8)
            if int8:
                best = max(best, rate)
            figures = [f"{pieces:,}", f"{rate:,.1f}", f"{baseline:,.0f}", f"{rate / baseline:.3f}"]
            rows.append([name, MODELS[int8], str(count), *figures])
    return rows, best


def run(args: argparse.Namespace) -> Figures:
    sets = dict(zip(("user messages", "all messages"), load(args.data, args.messages), strict=True))
    rates, short_best = [], 0.0
    for name, texts in sets.items():
        rows, best = rate_rows(name, texts, args.threads)
        rates += rows
        if name == "user messages":
            short_best = best
    caught_up = [catch_up_row(sets["user messages"], size) for size in args.catch_up]
    questions = load_questions(args.data)
    asked = [
        [MODELS[int8], *(f"{v:.2f}" for v in question_ms(questions, int8=int8))] for int8 in (False, True)
    ]
    return Figures(rates, short_best, caught_up, len(questions), asked)
