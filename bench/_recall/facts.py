"""The facts the recall benchmark plants: subjects, how the user states and changes them, how a question asks
for them, and their distinctive values."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

SERVICES = ["ledger", "checkout", "notifications", "identity", "catalog", "payouts", "telemetry", "scheduler"]


COLLEAGUES = ["Priya", "Tomás", "Mei", "Jonas", "Amara"]


NAMES = [
    "Ingrid Solberg", "Tariq Haddad", "Beatriz Okafor", "Hiroshi Tanabe", "Odile Marchetti", "Radek Novak",
    "Leilani Kealoha", "Gustavo Ferreira", "Yara Lindqvist", "Anselm Baptiste", "Noor Al-Rashid",
    "Wendell Achebe",
]  # fmt: skip


WORDS = [
    "falcon",
    "quartz",
    "juniper",
    "cobalt",
    "meridian",
    "tundra",
    "saffron",
    "obsidian",
    "lantern",
    "harbor",
]


REGIONS = ["eu2", "use1", "apse3", "euc1", "usw2"]


def _letters(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(n))


VALUES = {
    "key": lambda rng: f"{_letters(rng, 2)}-{rng.randint(1000, 9999)}",
    "port": lambda rng: str(rng.randint(20000, 64999)),
    "pager": lambda rng: f"+44 20 7946 {rng.randint(1000, 9999)}",
    "person": lambda rng: rng.choice(NAMES),
    "flag": lambda rng: f"ff_{rng.choice(WORDS)}_rollout_v{rng.randint(2, 9)}",
    "bucket": lambda rng: f"acme-{rng.choice(WORDS)}-archive-{rng.choice(REGIONS)}",
    "host": lambda rng: f"bastion-{rng.randint(10, 99)}.{rng.choice(REGIONS)}.acme.internal",
    "ticket": lambda rng: f"INC-{rng.randint(10000, 99999)}",
    "version": lambda rng: f"{rng.randint(6, 9)}.{rng.randint(21, 48)}.{rng.randint(10, 30)}",
    "rate": lambda rng: f"{rng.randint(11, 97)}50 requests per minute",
    "email": lambda rng: (
        f"{rng.choice('abdeghkmrst')}.{rng.choice(WORDS)}@northwind-{rng.randint(10, 99)}.example"
    ),
    "channel": lambda rng: f"#ops-{rng.choice(WORDS)}-{rng.choice(WORDS)}",
    "date": lambda rng: f"2025-{rng.randint(10, 12)}-{rng.randint(10, 28)}",
    "amount": lambda rng: f"${rng.randint(21, 89)},{rng.randint(1, 9)}00",
    "word": lambda rng: f"{rng.choice(WORDS).title()}{rng.choice(WORDS).title()}{rng.randint(10, 99)}",
}


SUBJECTS: list[dict[str, Any]] = [
    {
        "id": "deploy_key",
        "value": "key",
        "state": [
            "btw {person} rotated the staging deploy key for {svc} this morning, it's {v} now.",
            "Note for later: the deploy key for {svc} on staging is {v}.",
        ],
        "update": ["Heads-up, the {svc} staging deploy key changed again: use {v} from now on."],
        "ask": ["I'm about to push {svc} to staging. Which key do I need for that?"],
        "noun": "the key for staging deploys of {svc}",
    },
    {
        "id": "db_port",
        "value": "port",
        "state": ["The {svc} staging Postgres does not listen on 5432, it's on port {v}."],
        "update": ["They moved the {svc} staging database; it answers on port {v} now."],
        "ask": ["I can't connect to the {svc} staging DB, what port was it on again?"],
        "noun": "the port of the {svc} staging database",
    },
    {
        "id": "owner",
        "value": "person",
        "state": ["{v} took over ownership of {svc} last sprint, so questions about it go to them."],
        "update": ["Org change: {svc} is owned by {v} as of this week."],
        "ask": ["Who should I talk to about {svc} these days?"],
        "noun": "who owns {svc}",
    },
    {
        "id": "flag",
        "value": "flag",
        "state": ["We're gating the new {svc} flow behind a feature flag called {v}."],
        "update": ["The old flag for the {svc} flow is gone; the toggle is {v} now."],
        "ask": ["What's the name of the toggle that guards the new {svc} flow?"],
        "noun": "the name of the feature toggle for the new {svc} flow",
    },
    {
        "id": "bucket",
        "value": "bucket",
        "state": ["{svc} writes its nightly archive into the S3 bucket {v}."],
        "update": ["We migrated the {svc} archive; it lands in {v} from tonight."],
        "ask": ["Where does {svc} put its nightly archive, which bucket?"],
        "noun": "the bucket the {svc} archive goes to",
    },
    {
        "id": "bastion",
        "value": "host",
        "state": ["To reach the {svc} boxes you have to hop through {v} first."],
        "update": ["New jump host for {svc}: {v}, the old one is decommissioned."],
        "ask": ["Which jump host do I ssh through to get at the {svc} machines?"],
        "noun": "the jump host for the {svc} machines",
    },
    {
        "id": "incident",
        "value": "ticket",
        "state": ["I opened {v} for yesterday's {svc} outage, please reference it in the postmortem."],
        "update": ["The {svc} outage ticket was merged into {v}, use that one."],
        "ask": ["What was the ticket number for the {svc} outage?"],
        "noun": "the ticket of the {svc} outage",
    },
    {
        "id": "pin",
        "value": "version",
        "state": ["We pinned the {svc} client SDK to {v} until the retry bug is fixed upstream."],
        "update": ["Upstream fixed it, so the {svc} SDK pin moved to {v}."],
        "ask": ["Which SDK version is {svc} locked to right now?"],
        "noun": "the SDK version {svc} is locked to",
    },
    {
        "id": "rate",
        "value": "rate",
        "state": ["The partner API that {svc} calls throttles us at {v}."],
        "update": ["The partner raised the {svc} limit: {v} as of Monday."],
        "ask": ["How hard can {svc} hit the partner API before it gets throttled?"],
        "noun": "the partner API limit for {svc}",
    },
    {
        "id": "contact",
        "value": "email",
        "state": ["Northwind's technical contact for the {svc} integration is {v}."],
        "update": ["Northwind has a new contact for {svc}: {v}."],
        "ask": ["Who do I email at Northwind about the {svc} integration?"],
        "noun": "the Northwind contact for {svc}",
    },
    {
        "id": "channel",
        "value": "channel",
        "state": ["Alerts for {svc} go to the Slack channel {v}."],
        "update": ["We renamed the {svc} alert channel, it's {v} now."],
        "ask": ["Where do the {svc} alerts get posted in Slack?"],
        "noun": "the Slack channel for {svc} alerts",
    },
    {
        "id": "freeze",
        "value": "date",
        "state": ["We decided to freeze {svc} deploys starting {v}."],
        "update": ["The {svc} deploy freeze got pushed, it now starts {v}."],
        "ask": ["From when are {svc} deploys frozen?"],
        "noun": "the date the {svc} deploy freeze starts",
    },
    {
        "id": "budget",
        "value": "amount",
        "state": ["Finance approved a monthly cloud budget of {v} for {svc}."],
        "update": ["The {svc} cloud budget was cut to {v} a month."],
        "ask": ["How much can {svc} spend on cloud per month?"],
        "noun": "the monthly cloud budget of {svc}",
    },
    {
        "id": "vault",
        "value": "word",
        "state": ["The break-glass credentials for {svc} are in the vault entry {v}."],
        "update": ["We re-keyed {svc}; the break-glass vault entry is {v} now."],
        "ask": ["In an emergency, which vault entry has the {svc} credentials?"],
        "noun": "the vault entry with the {svc} break-glass credentials",
    },
]


# Facts about the user, no service: the phrasing the memory agent's rules know ("my X is Y").
PERSONAL: list[dict[str, Any]] = [
    {
        "id": "pager",
        "value": "pager",
        "state": ["My on-call pager number is {v}, in case anything catches fire."],
        "update": ["My pager number changed, it's {v} now."],
        "ask": ["What number should you give people who need to page me?"],
        "noun": "my pager number",
    },
    {
        "id": "manager",
        "value": "person",
        "state": ["My manager is {v}, she signs off the change requests."],
        "update": ["Re-org news: my manager is {v} now."],
        "ask": ["Who approves my change requests?"],
        "noun": "my manager's name",
    },
]


@dataclass
class Fact:
    subject: str
    values: list[str]  # first value, then the changes
    statements: list[str]
    ask: str
    noun: str
    turns: list[tuple[int, int]] = field(default_factory=list)  # (conversation, exchange) per statement
    seqs: list[int] = field(default_factory=list)


@dataclass
class Question:
    kind: str  # single | two facts | changed
    text: str
    required: list[str]
    stale: list[str] = field(default_factory=list)
