"""The generated conversation the compaction benchmark summarises: decisions and facts planted among
chatter."""

from __future__ import annotations

import random
from dataclasses import dataclass

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
