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
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._common import scratch_dir  # noqa: E402

TARGET_FACTS = 0.95
TARGET_SAVING = 0.70


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def setup_django(tmp: str) -> None:
    sys.path.insert(0, str(REPO))
    # Embedded and offline whatever the shell or a .env says: SQLite in the temp folder, no Redis, no LLM.
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.django.local",
        MNEMO_VAR_DIR=tmp,
        DATABASE_URL="",
        REDIS_URL="",
        CELERY_TASK_ALWAYS_EAGER="true",
        LLM_BASE_URL="",
        LLM_API_KEY="",
        LLM_MODEL="",
        MNEMO_LOG_LEVEL="ERROR",
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


# --- the conversation ------------------------------------------------------------------------------------

FIRST = [
    "Priya",
    "Tomasz",
    "Amara",
    "Kenji",
    "Lucia",
    "Omar",
    "Ingrid",
    "Mateo",
    "Aisha",
    "Henrik",
    "Mei",
    "Rafael",
    "Zanele",
    "Dmitri",
    "Siobhan",
    "Arjun",
    "Camille",
    "Yusuf",
    "Freya",
    "Nikolai",
    "Leilani",
    "Bruno",
    "Hana",
    "Emeka",
    "Vera",
]
LAST = [
    "Raman",
    "Kowalczyk",
    "Okafor",
    "Watanabe",
    "Ferreira",
    "Haddad",
    "Lindqvist",
    "Alvarez",
    "Siddiqui",
    "Berg",
    "Zhang",
    "Moreau",
    "Dlamini",
    "Volkov",
    "Gallagher",
    "Mehta",
    "Laurent",
    "Demir",
    "Nilsen",
    "Petrov",
    "Kahale",
    "Costa",
    "Sato",
    "Nwosu",
    "Novak",
]
AREAS = ["ingest", "billing", "search", "auth", "export", "scheduler", "gateway", "reports", "audit", "cache"]
DECISIONS = [
    "use Kafka for the event bus",
    "keep the ledger on PostgreSQL instead of DynamoDB",
    "ship the mobile release behind a feature flag",
    "drop support for the legacy CSV importer",
    "run the nightly export at half past two UTC",
    "store invoices as PDF and JSON side by side",
    "rotate API keys every ninety days",
    "move the search cluster to dedicated hosts",
    "cap free accounts at three projects",
    "freeze the public API until the audit ends",
    "page the on-call engineer only for customer-facing alerts",
    "write the new parser in Rust",
    "archive chat logs after one year",
    "bill overage monthly rather than weekly",
    "retire the staging-eu environment",
    "adopt trunk-based development for the web team",
    "encrypt backups with customer-managed keys",
    "keep the onboarding tour to five steps",
    "let support staff edit core memory with an audit trail",
    "batch email digests per timezone",
    "split the gateway into read and write services",
    "translate the help centre into Portuguese first",
    "replace the cron jobs with the workflow engine",
    "keep screenshots for thirty days in cold storage",
    "publish the status page from a separate provider",
]
SUBJECTS = [
    "the retry logic",
    "the cache layer",
    "the nightly job",
    "the login flow",
    "the export worker",
    "the search index",
    "the billing report",
    "the deploy script",
    "the rate limiter",
    "the webhook handler",
    "the onboarding email",
    "the admin dashboard",
    "the mobile sync",
    "the audit trail",
    "the CSV import",
    "the permission check",
    "the status page",
    "the queue consumer",
    "the PDF renderer",
    "the feature flag",
]
PREDICATES = [
    "looks fine to me",
    "seems slower than last week",
    "needs a second review",
    "should be simpler",
    "is flaky on the CI runners",
    "was rewritten recently",
    "still logs far too much",
    "could use a better name",
    "behaves differently in staging",
    "is covered by the new tests",
    "breaks when two requests overlap",
    "confuses new customers",
    "depends on an old library",
    "times out under load",
    "has no owner at the moment",
]
FRAMES = [
    "I think {s} {p}.",
    "Honestly, {s} {p}.",
    "From what I can see, {s} {p}.",
    "Can you confirm that {s} {p}?",
    "My worry is that {s} {p}.",
    "Apparently {s} {p}.",
    "Somebody mentioned that {s} {p}.",
    "Let us check whether {s} {p}.",
    "It turns out {s} {p}.",
    "I doubt that {s} {p}.",
]
CHATTER = [
    "Thanks, that helps.",
    "Makes sense to me.",
    "Let me look into it after lunch.",
    "Good catch.",
    "I will write a short note for the team.",
    "Please keep the answer short.",
    "Sounds good, go ahead.",
    "Let us not touch the schema in the same change.",
    "I pushed a draft, comments welcome.",
]
NOISE = [
    "It took about {m} minutes on my machine.",
    "I retried {k} times before it went through.",
    "See page {p} of the runbook for the details.",
    "Ping me on Slack if the build breaks again.",
    "The ticket is still open in Jira.",
    "I updated README.md with the new steps.",
    "The dashboard showed {p} errors in the last hour.",
]
LEADS = [
    "For the record,",
    "Just so you know,",
    "Remember that",
    "Note that",
    "As agreed,",
    "To be clear,",
    "Quick update:",
    "Important:",
    "FYI,",
    "Before I forget,",
]
NUMBER_CLAUSES = [
    ("the nightly batch must process {v} records per run", lambda r: f"{r.randint(10_000, 99_999):,}"),
    ("our monthly cloud budget is capped at ${v}", lambda r: f"{r.randint(20_000, 90_000):,}"),
    ("the p99 latency target for checkout is {v} ms", lambda r: str(r.randint(301, 899))),
    ("the internal gateway listens on port {v}", lambda r: str(r.randint(20_000, 29_999))),
    ("audit logs are retained for {v} days", lambda r: str(r.randint(400, 999))),
    ("the import job handles {v} rows per minute", lambda r: f"{r.randint(10_000, 60_000):,}"),
    ("each tenant may make {v} API calls per hour", lambda r: f"{r.randint(1_000, 9_999):,}"),
    ("the SLA credit starts after {v} minutes of downtime", lambda r: str(r.randint(41, 97))),
]
PATH_CLAUSES = [
    "the change belongs in {v}",
    "the bug lives in {v}",
    "please do not edit {v} by hand",
    "{v} holds the retry settings",
    "I moved the helpers into {v}",
]
NAME_CLAUSES = [
    "{v} will review the rollout plan",
    "{v} owns the incident follow-up",
    "ask {v} about the contract",
    "{v} approved the budget change",
    "{v} is our contact at the customer",
]


@dataclass(frozen=True)
class Planted:
    kind: str  # number | path | name | decision
    probe: str  # the text that must survive
    sentence: str


def _capital(text: str) -> str:
    return text[0].upper() + text[1:]


def planted_facts(rng: random.Random) -> list[Planted]:
    facts: list[Planted] = []
    for i in range(25):
        clause, value = NUMBER_CLAUSES[i % len(NUMBER_CLAUSES)]
        v = value(rng)
        facts.append(Planted("number", v, f"{rng.choice(LEADS)} {clause.format(v=v)}."))
    for i in range(25):
        folder = rng.choice(["handlers", "models", "jobs", "views"])
        path = f"src/{AREAS[i % len(AREAS)]}/{folder}/part_{i:02d}.py"
        facts.append(Planted("path", path, _capital(rng.choice(PATH_CLAUSES).format(v=path)) + "."))
    for i in range(25):
        name = f"{FIRST[i]} {LAST[(i * 7) % len(LAST)]}"
        facts.append(Planted("name", name, _capital(rng.choice(NAME_CLAUSES).format(v=name)) + "."))
    for decision in DECISIONS:
        facts.append(Planted("decision", decision, f"{rng.choice(LEADS)} we decided to {decision}."))
    rng.shuffle(facts)
    return facts


def filler(rng: random.Random) -> str:
    return rng.choice(FRAMES).format(s=rng.choice(SUBJECTS), p=rng.choice(PREDICATES))


def generate(rng: random.Random, count: int) -> tuple[list[dict], list[Planted]]:
    facts = planted_facts(rng)
    slots = sorted(rng.sample(range(count - 10), len(facts)))  # never in the last ten: those stay verbatim
    by_slot = dict(zip(slots, facts, strict=True))
    messages = []
    for i in range(count):
        role = "user" if i % 2 == 0 else "assistant"
        sentences = [filler(rng), filler(rng)] if rng.random() < 0.6 else [filler(rng), rng.choice(CHATTER)]
        if rng.random() < 0.25:
            sentences.append(
                rng.choice(NOISE).format(m=rng.randint(10, 59), k=rng.randint(2, 9), p=rng.randint(10, 99))
            )
        if i in by_slot:
            sentences.insert(rng.randint(0, len(sentences)), by_slot[i].sentence)
        messages.append({"role": role, "content": " ".join(sentences)})
    return messages, facts


# --- measuring ---------------------------------------------------------------------------------------------


def kept(facts: list[Planted], text: str) -> dict[str, float]:
    from providers.summariser import normalise

    shown = normalise(text)
    out: dict[str, float] = {}
    for kind in ("number", "path", "name", "decision"):
        group = [f for f in facts if f.kind == kind]
        out[kind] = sum(normalise(f.probe) in shown for f in group) / len(group)
    out["all"] = sum(normalise(f.probe) in shown for f in facts) / len(facts)
    return out


def prompt_tokens(conversation) -> int:
    from context.pipeline import context_assemble
    from context.state import ContextRequest

    state = context_assemble(
        conversation=conversation,
        request=ContextRequest(user_message="What should I do next?", token_budget=120_000, record=False),
    )
    return state.tokens["total"]


def b6_text(conversation, after_seq: int) -> str:
    from conversations.models import Message

    return "\n".join(
        Message.objects.filter(conversation=conversation, kind="message", seq__gt=after_seq)
        .order_by("seq")
        .values_list("content", flat=True)
    )


def run(args: argparse.Namespace) -> dict:
    from conversations.models import Message
    from conversations.services import conversation_create, message_append_batch
    from providers.tokens import count_text
    from summaries.selectors import history_start_seq, segment_prompt_text, segments_live
    from summaries.services import compaction_run
    from tenants.services import tenant_create

    rng = random.Random(args.seed)
    messages, facts = generate(rng, args.messages)
    tenant, _ = tenant_create(slug="bench", name="Bench")
    conversation = conversation_create(tenant=tenant, model="gpt-4o", title="compaction bench")
    uncompacted = conversation_create(tenant=tenant, model="gpt-4o", title="no compaction")
    chunk = args.messages // args.compactions

    times: list[float] = []
    baseline_summary = ""
    for k in range(args.compactions):
        part = messages[k * chunk : (k + 1) * chunk]
        for target in (conversation, uncompacted):
            for i in range(0, len(part), 100):
                message_append_batch(conversation=target, items=part[i : i + 100])
        cut_before = history_start_seq(conversation)
        started = time.perf_counter()
        outcome = compaction_run(conversation=conversation, trigger="auto", sync=False)
        times.append((time.perf_counter() - started) * 1000)
        b4_tokens = sum(s.token_count for s in segments_live(conversation=conversation))
        log(
            f"compaction {k + 1}: messages {outcome.start_seq}–{outcome.end_seq}, {outcome.source}, "
            f"{len(outcome.rollups)} roll-up(s), B4 {b4_tokens} tokens, {times[-1]:.0f} ms"
        )
        baseline_summary = summary_of_summary(
            conversation,
            baseline_summary,
            after_seq=cut_before,
            to_seq=outcome.end_seq,
            target_tokens=b4_tokens,
        )

    cut = history_start_seq(conversation)
    recent = b6_text(conversation, cut)
    live = segments_live(conversation=conversation)
    mnemo_b4 = "\n\n".join(segment_prompt_text(s) for s in live)
    before = prompt_tokens(uncompacted)
    after = prompt_tokens(conversation)
    baseline_after = after - sum(s.token_count for s in live) + count_text(baseline_summary, model="gpt-4o")
    return {
        "mnemo": kept(facts, mnemo_b4 + "\n" + recent),
        "baseline": kept(facts, baseline_summary + "\n" + recent),
        "before": before,
        "after": after,
        "baseline_after": baseline_after,
        "times": times,
        "segments": len(live),
        "b6_messages": Message.objects.filter(conversation=conversation, kind="message", seq__gt=cut).count(),
        "facts_checked": sum(s.facts_checked for s in live),
        "facts_missing": sum(s.facts_missing for s in live),
    }


def summary_of_summary(
    conversation, previous: str, *, after_seq: int, to_seq: int, target_tokens: int
) -> str:
    """The baseline: it compacts the same range as Mnemo did, folding its previous summary in, at the same
    token spend."""
    from conversations.models import Message
    from providers.summariser import SourceMessage, summarise
    from providers.tokens import count_text

    raw = Message.objects.filter(
        conversation=conversation, kind="message", seq__gt=after_seq, seq__lte=to_seq
    ).order_by("seq")
    sources = [SourceMessage(seq=0, role="system", text=previous)] if previous else []
    sources += [SourceMessage(seq=m.seq, role=m.role, text=m.content) for m in raw]
    return summarise(
        sources, target_tokens=target_tokens, count_tokens=lambda t: count_text(t, model="gpt-4o")
    )


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "∞"


def table(result: dict, args: argparse.Namespace) -> str:
    mnemo = result["mnemo"]
    saving = 1 - result["after"] / result["before"]
    rows = [*_fact_rows(result["mnemo"], result["baseline"]), *_token_rows(result)]
    head = ("metric", "Mnemo", "summary-of-summary", "ratio")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    lines = [
        f"Compaction benchmark — {args.messages} messages, {args.compactions} compactions, "
        f"offline extractive summariser, seed {args.seed}",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · {platform.machine()} · {os.cpu_count()} CPUs · "
        f"Python {platform.python_version()}",
        "",
        " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)),
        "-|-".join("-" * w for w in widths),
        *(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows),
        "",
        f"Mnemo after: {result['segments']} live segment(s) + {result['b6_messages']} verbatim messages; "
        f"fact check: {result['facts_missing']} of {result['facts_checked']} facts re-added.",
        f"Targets: ≥ {TARGET_FACTS:.0%} facts kept → {'met' if mnemo['all'] >= TARGET_FACTS else 'MISSED'}; "
        f"≥ {TARGET_SAVING:.0%} fewer tokens → {'met' if saving >= TARGET_SAVING else 'MISSED'}.",
    ]
    return "\n".join(lines)


def _fact_rows(mnemo: dict, base: dict) -> list[tuple[str, str, str, str]]:
    """Planted facts kept, in all and by kind, against summary-of-summary."""
    kinds = [
        ("planted facts kept in B4 + B6", "all"),
        ("· numbers (25)", "number"),
        ("· file paths (25)", "path"),
        ("· names (25)", "name"),
        ("· decisions (25)", "decision"),
    ]
    return [(label, _pct(mnemo[k]), _pct(base[k]), _ratio(mnemo[k], base[k])) for label, k in kinds]


def _token_rows(result: dict) -> list[tuple[str, str, str, str]]:
    """Prompt tokens before and after, and the compactions' time."""
    saving = 1 - result["after"] / result["before"]
    base_saving = 1 - result["baseline_after"] / result["before"]
    return [
        ("prompt tokens before (no compaction)", f"{result['before']:,}", f"{result['before']:,}", "1.00×"),
        (
            "prompt tokens after",
            f"{result['after']:,}",
            f"{result['baseline_after']:,}",
            _ratio(result["after"], result["baseline_after"]),
        ),
        ("fewer prompt tokens", _pct(saving), _pct(base_saving), _ratio(saving, base_saving)),
        (
            "compaction time, mean / max (ms)",
            f"{statistics.mean(result['times']):.0f} / {max(result['times']):.0f}",
            "—",
            "",
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--compactions", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.messages < 100 * args.compactions // 5 or args.compactions < 1:
        parser.error("use at least 20 messages per compaction")
    with scratch_dir("mnemo-bench-compaction-") as tmp:
        setup_django(str(tmp))
        log(f"generating {args.messages} messages and compacting {args.compactions} times …")
        result = run(args)
    print(table(result, args))
    met = result["mnemo"]["all"] >= TARGET_FACTS and 1 - result["after"] / result["before"] >= TARGET_SAVING
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
