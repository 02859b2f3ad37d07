"""Shared by the benchmarks: the progress log, the machine header, the results table, percentiles, and a
seeded generator of realistic agent conversations (the same text for every benchmark that uses it).

Not a benchmark itself; nothing here runs on import.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL = "gpt-4o"


def log(message: str) -> None:
    # Progress goes to stderr so stdout carries only the header and the tables.
    print(message, file=sys.stderr, flush=True)


# --- report ------------------------------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def git_commit() -> str:
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)

    commit = git("rev-parse", "--short", "HEAD").stdout.strip() or "none"
    # Numbers measured on a tree with uncommitted changes to tracked files are not those of the commit.
    if git("diff", "--quiet", "HEAD").returncode == 1:
        commit += " (+uncommitted changes)"
    return commit


def machine_header(script: str, *extra: str) -> str:
    cores = len(os.sched_getaffinity(0))
    lines = [
        f"# {script}  {datetime.now(UTC):%Y-%m-%d %H:%M UTC}  {platform.platform()}",
        f"# CPU {cpu_model()}, {cores} cores  Python {platform.python_version()}  commit {git_commit()}",
    ]
    return "\n".join(lines + [f"# {line}" for line in extra])


def render_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table that reads in a terminal and pastes into docs/benchmarks.md."""
    table = [list(head), *[list(r) for r in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in table]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile: a value that was actually measured, never an interpolation."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


# --- realistic conversation text ---------------------------------------------------------------------------
# An engineer talking to an operations/coding assistant. Sentences are filled from small vocabularies with
# numbers, paths and names so that no two messages are the same text; lengths are drawn per message and
# reached by adding sentences until the tokenizer says so.

SERVICES = [
    "billing-api",
    "export-worker",
    "search-indexer",
    "auth-gateway",
    "report-builder",
    "ingest-queue",
]
PATHS = [
    "src/export/batch.py", "deploy/helm/values.yaml", "services/billing/invoice.go", "web/src/api/client.ts",
    "migrations/0042_backfill_status.sql", "config/retry.toml", "lib/pool/connection.py",
]  # fmt: skip
PEOPLE = ["Priya", "Tomás", "Mei", "Jonas", "Amara", "Luca", "Sofia", "Kenji"]
TABLES = ["invoices", "export_jobs", "sessions", "audit_log", "customers", "usage_events"]
ERRORS = [
    "TimeoutError",
    "ConnectionResetError",
    "PoolExhausted",
    "HTTP 503",
    "deadlock detected",
    "OOMKilled",
]

USER_OPENERS = [
    "Can you help me figure out why {service} keeps failing after the deploy on {date}?",
    "I need a second opinion on the change {person} proposed for {path}.",
    "We saw {n} errors of type {error} from {service} overnight, and I do not understand the pattern yet.",
    "Quick follow-up on the {table} migration we talked about earlier.",
    "The p99 latency of {service} went from {ms} ms to {ms2} ms this week, and nobody changed the code.",
    "I am writing the incident report for the {service} outage and want to get the timeline right.",
    "Could you review the retry logic in {path} before I merge it?",
    "Our nightly job on {table} now takes {n} minutes instead of {n2}, which breaks the morning reports.",
    "{person} asked whether we can drop the old index on {table} without hurting the dashboards.",
    "I tried your suggestion from before, and the {error} is gone, but now {service} logs warnings.",
]
USER_CONTEXT = [
    "The job runs at 02:00 UTC and processes about {n} rows per batch.",
    "We deploy {service} with {n} replicas behind the gateway, each with a pool of {k} connections.",
    "The error shows up only when the batch size is above {n}, never below.",
    "I checked the dashboard and CPU stays under {pct} % the whole time, so it is not saturation.",
    "{person} thinks it is the new version of the client library, {version}, but I am not convinced.",
    "The logs say the request was retried {k} times before it gave up with {error}.",
    "We cannot change the schema of {table} this sprint because the data team depends on it.",
    "The staging environment does not reproduce it, which makes me think it depends on real traffic.",
    "I already ruled out the network: the gateway reports no resets in the same window.",
    "The customer on the ticket is waiting for an answer by {weekday}, so a small fix would be ideal.",
    "Memory grows by roughly {n} MB per hour until the pod is restarted.",
    "The last change to {path} was a refactor that moved the timeout into the config file.",
    "Our runbook says to restart the worker, but that only hides the problem for a few hours.",
    "It started right after we raised the concurrency from {k} to {k2} workers.",
]
USER_ASKS = [
    "What would you check first?",
    "Is there a safer way to roll this out?",
    "Can you propose a fix and tell me how to test it?",
    "Does that explanation hold up, or am I missing something?",
    "How would you word this for the team channel?",
    "What are the risks if we ship it today?",
    "Which metric should I watch to know it worked?",
]
ASSISTANT_OPENERS = [
    "Short answer: the pattern points at connection reuse in {service}, not at the code that changed.",
    "Looking at what you described, the timing lines up with the pool size change rather than the deploy.",
    "Good catch on the batch size; that detail narrows it down a lot.",
    "I would not drop the index yet, because two of the dashboard queries on {table} still use it.",
    "The retry logic in {path} is mostly right, but it retries on errors that are not transient.",
    "Here is how I would reconstruct the timeline for the report.",
    "The slowdown is consistent with the table growing past the point where the planner switches plans.",
]
ASSISTANT_BODY = [
    "Each replica opens up to {k} connections, so {n} replicas can ask the database for more than it allows.",
    "When that happens the pool blocks, the request times out after {ms} ms, and the client retries.",
    "The retries then add load at exactly the wrong moment, which is why the errors come in bursts.",
    "A {error} in the middle of a batch leaves the job half done, and the next run starts from the top.",
    "Backing off exponentially, with jitter, spreads the retries so they stop arriving together.",
    "The planner estimates {n} rows for that filter, and the real count is closer to {n2}.",
    "Running ANALYZE on {table} after the backfill should bring the estimate back in line.",
    "The warning you see now is harmless: it is the pool reporting that it waited, not that it failed.",
    "I would keep the change small: cap the pool at {k} per replica and make the timeout explicit.",
    "The metric to watch is the wait time on the pool, which should stay under {ms} ms at p99.",
    "If {person} wants a guarantee, a test can run the batch with {n} rows against a real database.",
    "Nothing in {path} needs to change for this; the configuration is enough.",
    "The incident started at {time} UTC, alerts fired {k} minutes later, the rollback ended at {time2}.",
    "Customers saw failed exports for about {k2} minutes; no data was lost, the jobs are idempotent.",
    "The dashboards read from the replica, so dropping the index would slow them by about {pct} %.",
    "An alternative is a partial index on the rows the job actually touches, which is much smaller.",
]
ASSISTANT_STEPS = [
    "1. Reproduce with a batch of {n} rows on staging.\n2. Add the failing case as a test.\n"
    "3. Ship the pool cap behind a flag for one tenant.\n4. Watch the pool wait time for a day.",
    "1. Check `{service}` logs for {error} around {time}.\n2. Compare the replica count before and after.\n"
    "3. Confirm the pool settings in {path}.",
    "- Keep the old index until the dashboards move.\n- Add the partial index concurrently.\n"
    "- Drop the old one next sprint.",
]
CODE_BLOCKS = [
    "```python\ndef retry(fn, attempts={k}, base=0.2):\n    for i in range(attempts):\n        try:\n"
    "            return fn()\n        except TimeoutError:\n"
    "            time.sleep(base * 2**i + random.random() / 10)\n"
    "    raise RuntimeError('gave up after retries')\n```",
    "```sql\nCREATE INDEX CONCURRENTLY {table}_pending_idx\n    ON {table} (created_at)\n"
    "    WHERE status = 'pending';\nANALYZE {table};\n```",
    "```yaml\n{service}:\n  replicas: {k}\n  pool:\n    max_size: {k2}\n    timeout_ms: {ms}\n```",
]
TOOLS = {
    "search_logs": lambda f: {"service": f["service"], "query": f["error"], "since": "24h"},
    "read_file": lambda f: {"path": f["path"]},
    "run_sql": lambda f: {"query": f"SELECT status, count(*) FROM {f['table']} GROUP BY status"},
    "get_metrics": lambda f: {"service": f["service"], "metric": "latency_p99", "window": "7d"},
}
LOG_MESSAGES = [
    "acquired connection in {ms} ms",
    "retrying after {error} (attempt {k})",
    "batch {n} committed, {n2} rows",
    "pool wait exceeded {ms} ms",
    "request finished status=200 duration_ms={ms}",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]


def _fill(rng: random.Random, template: str) -> str:
    values = {
        "service": rng.choice(SERVICES),
        "path": rng.choice(PATHS),
        "person": rng.choice(PEOPLE),
        "table": rng.choice(TABLES),
        "error": rng.choice(ERRORS),
        "n": rng.randint(20, 90) * 100,
        "n2": rng.randint(2, 19) * 100,
        "k": rng.randint(2, 12),
        "k2": rng.randint(13, 40),
        "ms": rng.randint(12, 900),
        "ms2": rng.randint(900, 4000),
        "pct": rng.randint(10, 70),
        "version": f"{rng.randint(1, 4)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}",
        "date": f"2025-0{rng.randint(1, 9)}-{rng.randint(10, 28)}",
        "time": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}",
        "time2": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}",
        "weekday": rng.choice(WEEKDAYS),
    }
    return template.format(**values)


def _grow(
    rng: random.Random, count: Callable[[str], int], target: int, first: str, pools: Sequence[list[str]]
) -> str:
    """`first`, then sentences drawn from `pools` in turn until the text reaches about `target` tokens.
    A template is not reused within one message while the pool has unused ones."""
    text, tokens, previous = first, count(first), first
    used: set[str] = set()
    i = 0
    while tokens < target:
        pool = pools[i % len(pools)]
        fresh = [t for t in pool if t not in used] or pool
        template = rng.choice(fresh)
        used.add(template)
        piece = _fill(rng, template)
        # Lists and code blocks stand in paragraphs of their own, as a model would write them.
        text += ("\n\n" if "\n" in piece + previous else " ") + piece
        previous = piece
        tokens += count(piece) + 1  # adding counts is close enough to aim at a length
        i += 1
    return text


def _tool_output(rng: random.Random, count: Callable[[str], int], target: int, name: str) -> str:
    lines: list[str] = []
    tokens = 0
    while tokens < target:
        if name == "run_sql":
            line = f"{rng.choice(['pending', 'done', 'failed', 'retrying'])} | {rng.randint(1, 90000)}"
        elif name == "read_file":
            line = _fill(rng, rng.choice(CODE_BLOCKS)).strip("`\n").split("\n", 1)[-1]
        else:
            line = (
                f"{_fill(rng, '{date}T{time}')}:{rng.randint(0, 59):02d}Z "
                f"{rng.choice(['INFO', 'WARN', 'ERROR'])} {rng.choice(SERVICES)} "
                f"pid={rng.randint(100, 9999)} request_id=req_{rng.getrandbits(32):08x} "
                f"{_fill(rng, rng.choice(LOG_MESSAGES))}"
            )
        lines.append(line)
        tokens += count(line) + 1
    return "\n".join(lines)


@dataclass
class Exchange:
    """One turn: the user's question, what the agent did (tool call and result, maybe), and its answer.
    `replies` are the messages appended after the question, in the shape message_append_batch takes."""

    question: str
    replies: list[dict[str, Any]] = field(default_factory=list)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.question, "parts": []}, *self.replies]


def conversation_script(
    rng: random.Random,
    turns: int,
    count: Callable[[str], int],
    *,
    tool_share: float = 0.3,
    user_tokens: tuple[int, int] = (100, 300),
    answer_tokens: tuple[int, int] = (150, 400),
    tool_tokens: tuple[int, int] = (100, 400),
) -> list[Exchange]:
    """`turns` exchanges; about `tool_share` of them call a tool before answering. `count` is the
    tokenizer (text -> tokens) the lengths are measured with."""
    script = []
    for t in range(turns):
        question = _grow(
            rng,
            count,
            rng.randint(*user_tokens),
            _fill(rng, rng.choice(USER_OPENERS)),
            [USER_CONTEXT, USER_CONTEXT, USER_ASKS],
        )
        replies: list[dict[str, Any]] = []
        if rng.random() < tool_share:
            replies += _tool_exchange(rng, count, t, tool_tokens)
        pools = [ASSISTANT_BODY, ASSISTANT_BODY, ASSISTANT_STEPS if rng.random() < 0.5 else CODE_BLOCKS]
        answer = _grow(
            rng, count, rng.randint(*answer_tokens), _fill(rng, rng.choice(ASSISTANT_OPENERS)), pools
        )
        replies.append({"role": "assistant", "content": answer, "parts": []})
        script.append(Exchange(question=question, replies=replies))
    return script


def _tool_exchange(
    rng: random.Random, count: Callable[[str], int], turn: int, tool_tokens: tuple[int, int]
) -> list[dict[str, Any]]:
    """The assistant's call of a random tool and the tool's result."""
    name = rng.choice(sorted(TOOLS))
    values = {
        "service": rng.choice(SERVICES),
        "error": rng.choice(ERRORS),
        "path": rng.choice(PATHS),
        "table": rng.choice(TABLES),
    }
    call_id = f"call_{turn:03d}_{rng.getrandbits(40):010x}"
    call = {"type": "tool_call", "id": call_id, "name": name, "arguments": TOOLS[name](values)}
    output = _tool_output(rng, count, rng.randint(*tool_tokens), name)
    return [
        {
            "role": "assistant",
            "content": f"Let me look at that first ({name.replace('_', ' ')}).",
            "parts": [call],
        },
        {
            "role": "tool",
            "content": "",
            "parts": [{"type": "tool_result", "tool_call_id": call_id, "name": name, "content": output}],
        },
    ]


# A realistic B1: who the agent is and several hundred tokens of policy.
PROFILE_NAME = "Atlas"
PROFILE_SCOPE = (
    "helping the platform team of a mid-sized SaaS company operate, debug and change its production "
    "services (billing, exports, search, authentication and reporting)"
)
PROFILE_POLICY = """\
1. Answer the question that was asked first, in one or two sentences, then give the reasoning and steps.
2. Be precise about facts: quote service names, file paths, table names, numbers and timestamps exactly as
   they appear in the conversation or in tool output. Never invent a metric, a log line or a file that was
   not shown.
3. When you are not sure, say so and name the one check that would settle it. Prefer a cheap check (a log
   search, a metric, a read-only query) over a change.
4. Use tools when the answer depends on the current state of a system: search_logs for errors and
   timelines, get_metrics for latency and error rates, read_file for code and configuration, run_sql for
   read-only queries. Never run a query that writes, locks a table or scans more than one day of a large
   table without asking.
5. Changes to production follow the team's rules: small steps, behind a flag when possible, one tenant
   first, with a rollback plan written down before the change. Never suggest disabling authentication, TLS
   verification, backups or audit logging, even temporarily.
6. Schema changes: add before you remove. New columns are nullable first and backfilled in a separate step;
   indexes are created concurrently; nothing is dropped in the same release that stops using it.
7. Incidents: keep a timeline in UTC with the source of each entry (alert, log line, person). Separate what
   is known from what is assumed. Blameless wording: describe what the system allowed, not who made a
   mistake.
8. Customer data: do not paste personal data (names, e-mail addresses, payment details) from tool output
   into answers; refer to records by their id. Data of one tenant is never used to answer a question about
   another.
9. Code: follow the existing style of the file you are changing. Show the smallest diff that fixes the
   problem, with a test that fails before the change and passes after it. Mention any behaviour change
   explicitly.
10. Security findings (leaked keys, injection, missing authorisation checks) are reported at once, with the
    file and line, and are never discussed in public channels.
11. Keep answers short: at most a screen of text unless the user asks for more. Use numbered steps for
    procedures, code blocks for code and commands, and plain sentences for everything else.
12. When the user writes in another language, answer in that language; technical identifiers stay unchanged.
13. If a request conflicts with these rules, explain which rule and offer the closest safe alternative."""


def summary_text(rng: random.Random, count: Callable[[str], int], target: int) -> str:
    """A summary segment as the offline summariser writes one: sections of bullet points with the requests,
    decisions and facts of the range, about `target` tokens."""
    sections = [
        ("Requests and intent", USER_OPENERS),
        ("Decisions", ASSISTANT_OPENERS + ASSISTANT_BODY),
        ("Key facts", USER_CONTEXT),
        ("Open tasks", USER_ASKS + ASSISTANT_BODY),
    ]
    lines: list[str] = []
    tokens = 0
    while tokens < target:
        for title, pool in sections:
            if tokens >= target:
                break
            bullets = [f"- {_fill(rng, rng.choice(pool))}" for _ in range(rng.randint(2, 4))]
            piece = "\n".join([f"{title}:", *bullets])
            lines.append(piece)
            tokens += count(piece) + 1
    return "\n".join(lines)
