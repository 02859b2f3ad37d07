"""Recall beyond the window: can the agent still answer about a fact stated hundreds of exchanges ago?

A seeded conversation of N exchanges between an engineer and an assistant carries F planted facts ("Remember
that the staging deploy key for billing is KX-4821", "My on-call pager number is 5550-1234", …) among filler
chat. After the conversation, one question per fact is asked in different words ("Which deploy key does
billing staging use?"). A fact counts as recalled when its value is in what the prompt would carry:

- Mnemo: the recency window (the last W messages) + B5 as the context pipeline builds it — the memory agent's
  archival memories (rules, run after the exchanges) searched hybrid/lexical with RRF, plus BM25 recall over
  the messages before the window — top 8 items.
- Baseline (same run): the recency window alone.

Run from the repository root:  .venv/bin/python bench/recall.py   (--quick for a smoke run)
Target at 2k exchanges: Mnemo ≥ 0.85 and at least twice the recency window.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import django_setup, log, machine_header, render_table

SERVICES = [
    "billing",
    "search",
    "checkout",
    "auth",
    "ledger",
    "mailer",
    "reports",
    "gateway",
    "avatar",
    "sync",
]
THINGS = [
    ("deploy key for {s} staging", "Which deploy key does {s} staging use?"),
    ("database port of {s}", "On which port does the {s} database listen?"),
    ("owner of the {s} service", "Who owns {s}?"),
    ("feature flag guarding {s} v2", "What flag guards the {s} v2 rollout?"),
]
FILLER_USER = [
    "Can you check the logs again?",
    "Thanks, that helps. What should I look at next?",
    "Let us keep going with the plan as discussed.",
    "I had a look and everything seems fine for now.",
    "Please summarise where we are.",
    "Any idea why the build is slow today?",
]
FILLER_ASSISTANT = [
    "Sure, I looked through the recent output and nothing stands out.",
    "The build is slower because the cache was cold after the runner restart.",
    "We are on track; the remaining items are the review and the release notes.",
    "I would look at the queue depth and the error rate next.",
]


def value(rng: random.Random) -> str:
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    return f"{rng.choice(letters)}{rng.choice(letters)}-{rng.randint(1000, 9999)}"


def build(n: int, facts: int, seed: int) -> tuple[list[dict], list[tuple[str, str]]]:
    rng = random.Random(seed)
    planted = {}
    pairs = [(t, s) for s in SERVICES for t in THINGS]
    rng.shuffle(pairs)
    positions = sorted(rng.sample(range(n), min(facts, len(pairs), n)))
    for pos, ((statement, question), service) in zip(positions, pairs, strict=False):
        planted[pos] = (statement.format(s=service), question.format(s=service), value(rng))
    items, questions = [], []
    for i in range(n):
        if i in planted:
            statement, question, val = planted[i]
            items.append({"role": "user", "content": f"Remember that the {statement} is {val}."})
            items.append({"role": "assistant", "content": "Noted, I will keep that in mind."})
            questions.append((question, val))
        else:
            items.append({"role": "user", "content": rng.choice(FILLER_USER)})
            items.append({"role": "assistant", "content": rng.choice(FILLER_ASSISTANT)})
    return items, questions


def run(n: int, facts: int, window: int, seed: int) -> dict:
    from conversations.models import Message
    from conversations.services import conversation_create, message_append_batch
    from memory.agent import memory_agent_run
    from memory.archival import archival_search
    from memory.recall import recall_messages
    from tenants.services import tenant_create

    tenant, _ = tenant_create(slug=f"bench-recall-{n}-{seed}-{time.time_ns()}", name="bench")
    conversation = conversation_create(tenant=tenant, end_user_external_id="eve", title="recall")
    items, questions = build(n, facts, seed)
    for i in range(0, len(items), 100):
        message_append_batch(conversation=conversation, items=items[i : i + 100])
    started = time.perf_counter()
    memory_agent_run(conversation=conversation)
    agent_ms = (time.perf_counter() - started) * 1000
    last = Message.objects.filter(conversation=conversation).order_by("-seq").values_list("seq", flat=True)[0]
    window_start = max(0, last - window)
    window_text = " ".join(
        Message.objects.filter(conversation=conversation, seq__gt=window_start).values_list(
            "content", flat=True
        )
    )
    mnemo = baseline = via_memory = via_recall = 0
    latencies = []
    for question, val in questions:
        in_window = val in window_text
        baseline += in_window
        t0 = time.perf_counter()
        hits = archival_search(end_user=conversation.end_user, query=question, limit=5).hits
        memories = [h.memory.content for h in hits]
        recalled = [
            h.content
            for h in recall_messages(
                conversation=conversation, query=question, before_seq=window_start, limit=3
            )
        ]
        latencies.append((time.perf_counter() - t0) * 1000)
        found_memory = any(val in t for t in memories)
        found_recall = any(val in t for t in recalled)
        via_memory += found_memory
        via_recall += found_recall
        mnemo += in_window or found_memory or found_recall
    total = len(questions) or 1
    return {
        "n": n,
        "facts": len(questions),
        "mnemo": mnemo / total,
        "baseline": baseline / total,
        "via_memory": via_memory / total,
        "via_recall": via_recall / total,
        "agent_ms": agent_ms,
        "search_ms": sorted(latencies)[len(latencies) // 2] if latencies else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--window", type=int, default=200, help="recency window in messages (default 200)")
    parser.add_argument("--facts", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    sizes = [100, 300] if args.quick else [200, 500, 1000, 2000]
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-recall-") as tmp:
        django_setup(var_dir=Path(tmp))
        from providers.embeddings import embedder_status

        status = embedder_status()
        embeddings = status.embedder.name if status.embedder else f"none ({status.reason})"
        results = []
        for n in sizes:
            log(f"{n} exchanges …")
            results.append(run(n, args.facts, args.window, args.seed))
    print(
        machine_header(
            "bench/recall.py",
            f"{args.facts} planted facts per conversation, questions reworded; recency window {args.window} "
            f"messages; seed {args.seed}; embeddings: {embeddings}; embedded SQLite",
        )
    )
    rows = [
        [
            f"{r['n']:,}",
            str(r["facts"]),
            f"{r['mnemo']:.2f}",
            f"{r['baseline']:.2f}",
            f"{r['mnemo'] / r['baseline']:.1f}×" if r["baseline"] else "∞",
            f"{r['via_memory']:.2f}",
            f"{r['via_recall']:.2f}",
            f"{r['agent_ms']:.0f}",
            f"{r['search_ms']:.1f}",
        ]
        for r in results
    ]
    head = [
        "exchanges",
        "facts",
        "recall Mnemo",
        "recall window (baseline)",
        "ratio",
        "archival alone",
        "message recall alone",
        "agent ms",
        "search p50 ms",
    ]
    print(render_table(head, rows))


if __name__ == "__main__":
    main()
