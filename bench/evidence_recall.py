"""Evidence recall through the public API: does the prompt Mnemo's context endpoint returns hold the evidence
for a question asked at the end of a long real conversation? Measured as a client would, over HTTP only.

Data: public long multi-session chats with message-level evidence labels that nobody here wrote: BEAM's 128K
tier in /work/shared/data/beam-128k/ (20 conversations of 188-310 messages, 98K-168K tokens each; 400
questions in 10 categories, 355 with evidence labels; see the README there). Read in place, never copied into
the repository; --data takes any JSONL of the same schema.

Method:
1. Load. For each conversation and each budget B (a client keeps one budget per conversation), one Mnemo
   conversation, end user "<dataset id>-b<B>", its messages appended in seq order in batches
   (POST /api/v1/conversations/{id}/messages {"messages": [{role, content, created_at}, ...]}), with
   created_at from the data. A message over MNEMO_MAX_MESSAGE_BYTES is sent truncated to the limit and the
   header says so (BEAM has one: a broken reply of 349K characters, mostly whitespace); a message's `name`
   (its speaker) is sent when the data has one. Then wait, as a client that imported a history would, on
   the one readiness signal GET /api/v1/conversations/{id} reports (`readiness.ready`: vectors, the memory
   agent's reading, due compactions; --index-timeout). No context call before the questions: the first
   question at a budget is the first call at it.
2. Ask. Every question of the conversation, in dataset order, as if after the last message:
   POST .../context {"user_message": <question>, "token_budget": B, "format": "openai"}. Recorded per call:
   client wall time, tokens.total, timings, degradation codes, dropped blocks, B5's tokens and item scores.
3. Score. The prompt is every string of the response's system and messages (content strings, text parts).
   A dataset message is present when at least half of its distinct word trigrams, or at least 120 of them (a
   verbatim passage of a long message), are among the prompt's; a message of under 3 words when its words
   occur as a contiguous run of the prompt's words. Words: re.findall(r"\\w+", text.lower()). ER of a
   question = present evidence messages / evidence messages, over the questions marked scored.

Baselines in the same run, on the same questions and messages: recency (the newest messages that fit) and
BM25 over the conversation's messages, computed by the dataset's own baselines.py (imported by path, len/4
tokens), and its oracle (the evidence alone, smallest first) as the ceiling whole-message packing allows.
Abstention questions (nothing to find) are reported apart: the B5 tokens they pull in and B5's top score,
next to the same figures for the scored questions.

Targets: ER@2000 >= 0.75 overall and >= BM25@2000 + 0.20; ER@8000 >= 0.90; no category below BM25 at either
budget; no context call over 250 ms (client side); every call answered. Exits 1 when one is missed (a budget
not run is "not measured"), after printing everything.

Run from the repository root:  .venv/bin/python bench/evidence_recall.py   (or: make bench-quality)
By default it starts its own server: a fresh var dir (SQLite, Celery eager), migrate, a tenant, uvicorn on a
free port; stopped at the end, also on error or Ctrl-C.
  --data PATH [--baselines PATH]     another dataset of the same schema (its baselines.py is used when
                                     there is one next to it, else the beam-128k one)
  --conversations 01,04 | N          those conversations (id or id suffix; "10," for one) or the first N
  --max-questions N                  the first N questions of each conversation
  --budgets 2000 8000                token budgets
  --var-dir DIR [--keep] [--reload]  server data and a manifest (dataset id + budget -> Mnemo conversation,
                                     API key) in DIR; with --keep they stay, and a later run with the same DIR
                                     (same data file, same kind of server) loads only what is missing and
                                     asks; --reload loads again from scratch. One DIR per dataset.
  --database-url URL [--redis-url U] the started server on PostgreSQL, a new tenant per load (with Redis: a
                                     Celery worker too; without, tasks run eagerly in the server)
  --url URL --api-key KEY            an already running server: nothing started or stopped
Data not kept is removed at the end: the temporary var dir, or the conversations this run created.
  --index-timeout S                  seconds to wait for the conversations to be ready (1800)
  --json PATH                        per-question results (evidence seqs and which were present, ER,
                                     tokens, B5 tokens, latency, degradations)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository goes first instead.
BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [str(BENCH_DIR.parent)] + [p for p in sys.path if Path(p or ".").resolve() != BENCH_DIR]

from bench._common import REPO, log, machine_header, percentile, render_table  # noqa: E402

DATA_DIR = Path("/work/shared/data/beam-128k")
DEFAULT_DATA = DATA_DIR / "beam-128k.jsonl"
BUDGETS = (2000, 8000)
MODEL = "gpt-4o"
HOST = "127.0.0.1"
BIN = Path(sys.executable).parent
MANIFEST = "evidence_recall_manifest.json"
DB_FILES = ("db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm", "db.sqlite3-journal")

TARGET_ER_2K = 0.75
TARGET_MARGIN_2K = 0.20
TARGET_ER_8K = 0.90
TARGET_MAX_MS = 250.0
# A long message counts as present when this many of its trigrams are in the prompt (a verbatim passage).
MIN_TRIGRAM_HITS = 120
WORD = re.compile(r"\w+")


# --- data --------------------------------------------------------------------------------------------------


@dataclass
class Dataset:
    path: Path
    sha256: str
    total: int  # conversations in the file
    conversations: list[dict[str, Any]]  # the selected ones, questions cut to --max-questions


def read_dataset(path: Path, spec: str | None, max_questions: int | None) -> Dataset:
    raw = path.read_bytes()
    every = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    chosen = select(every, spec)
    for conversation in chosen:
        conversation["messages"].sort(key=lambda m: m["seq"])
        if max_questions:
            conversation["questions"] = conversation["questions"][:max_questions]
    return Dataset(path, hashlib.sha256(raw).hexdigest(), len(every), chosen)


def select(conversations: list[dict[str, Any]], spec: str | None) -> list[dict[str, Any]]:
    """--conversations: a count ("2": the first two) or ids / id suffixes ("01,04", "10," for one)."""
    if not spec:
        return conversations
    if spec.isdigit() and not spec.startswith("0"):
        return conversations[: int(spec)]
    chosen = []
    for wanted in [s.strip() for s in spec.split(",") if s.strip()]:
        match = [c for c in conversations if c["id"] == wanted or c["id"].endswith(f"-{wanted}")]
        if len(match) != 1:
            raise SystemExit(f"--conversations: {wanted!r} matches {len(match)} conversations")
        chosen.append(match[0])
    return chosen


def truncation_notes(dataset: Dataset, limit: int) -> list[str]:
    return [
        f"{c['id']} seq {m['seq']}: {len(m['content'].encode()):,} bytes, sent as its first {limit:,}"
        for c in dataset.conversations
        for m in c["messages"]
        if len(m["content"].encode()) > limit
    ]


# --- scoring -----------------------------------------------------------------------------------------------


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def trigrams(ws: list[str]) -> set[tuple[str, str, str]]:
    return {(ws[i], ws[i + 1], ws[i + 2]) for i in range(len(ws) - 2)}


def prompt_strings(response: dict[str, Any]) -> list[str]:
    """Every string a model would read: the system (text or text blocks) and each message's content."""
    out: list[str] = []

    def take(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            out.extend(p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))

    take(response.get("system"))
    for message in response.get("messages") or []:
        take(message.get("content"))
    return out


@dataclass
class Prompt:
    grams: set[tuple[str, str, str]]
    runs: str  # " w1 w2 ... " per string, strings separated by a newline so no run spans two

    @classmethod
    def of(cls, response: dict[str, Any]) -> Prompt:
        per_string = [words(s) for s in prompt_strings(response)]
        grams = set().union(*(trigrams(ws) for ws in per_string)) if per_string else set()
        return cls(grams, " " + " \n ".join(" ".join(ws) for ws in per_string) + " ")

    def holds(self, message_words: list[str]) -> bool:
        if len(message_words) < 3:
            return bool(message_words) and f" {' '.join(message_words)} " in self.runs
        grams = trigrams(message_words)
        hits = len(grams & self.grams)
        return 2 * hits >= len(grams) or hits >= MIN_TRIGRAM_HITS


# --- HTTP --------------------------------------------------------------------------------------------------


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        self.status, self.code = status, error.get("code", "")
        message = error.get("message") or str(body)[:300]
        super().__init__(f"{method} {path} -> HTTP {status} {self.code}: {message}")


class Api:
    def __init__(self, url: str, api_key: str) -> None:
        self.http = httpx.Client(
            base_url=url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(300.0),
        )

    def call(self, method: str, path: str, body: Any = None) -> tuple[Any, float]:
        """The parsed answer and the client-side wall time in ms (request sent to body received)."""
        started = time.perf_counter()
        response = self.http.request(method, path, json=body)
        ms = (time.perf_counter() - started) * 1000
        try:
            data = response.json() if response.content else {}
        except ValueError:
            data = {"raw": " ".join(response.text.split())[:200]}  # an HTML error page, say
        if response.status_code >= 400:
            raise ApiError(method, path, response.status_code, data)
        return data, ms

    def close(self) -> None:
        self.http.close()


@dataclass
class Limits:
    """The server's append limits; the one started here gets this environment (defaults: config/django)."""

    batch: int = int(os.environ.get("MNEMO_MAX_BATCH_MESSAGES") or 100)
    message_bytes: int = int(os.environ.get("MNEMO_MAX_MESSAGE_BYTES") or 256 * 1024)


# --- the server --------------------------------------------------------------------------------------------


@dataclass
class Service:
    url: str
    api_key: str
    describe: str
    log_path: Path | None = None


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    return urlunsplit(parts)


def identity(args: argparse.Namespace) -> dict[str, str]:
    """What a kept load belongs to: reused only by a run against the same kind of server."""
    if args.url:
        return {"mode": "url", "url": args.url}
    if args.database_url:
        return {"mode": "postgres", "database_url": redact(args.database_url)}
    return {"mode": "sqlite"}


def secret_key(var_dir: Path) -> str:
    # DEBUG is off (it would keep every SQL statement in memory), so the server needs a key; it is kept
    # with the data so that a kept load is served the same way next time.
    path = var_dir / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def server_env(args: argparse.Namespace, var_dir: Path) -> dict[str, str]:
    skip = {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "CELERY_TASK_ALWAYS_EAGER"}
    env = {k: v for k, v in os.environ.items() if k not in skip}
    env.update(
        DJANGO_SETTINGS_MODULE="config.django.local",
        DJANGO_DEBUG="false",
        DJANGO_SECRET_KEY=secret_key(var_dir),
        DJANGO_ALLOWED_HOSTS=HOST,
        MNEMO_VAR_DIR=str(var_dir),
        MNEMO_LOG_LEVEL=os.environ.get("MNEMO_LOG_LEVEL", "WARNING"),
        # Empty counts as unset in config/env.py, and stops a .env file from filling these in.
        DATABASE_URL=args.database_url or "",
        REDIS_URL=args.redis_url or "",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def process(command: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen]:
    """A child in a session of its own (Ctrl-C reaches only us), stopped at the end whatever happened."""
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def wait_ready(url: str, api_key: str, proc: subprocess.Popen, log_path: Path) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            response = httpx.get(f"{url}/api/v1/conversations?limit=1", headers=headers, timeout=5)
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        if response.status_code != 200:
            raise SystemExit(f"the server answered HTTP {response.status_code}: {response.text[:500]}")
        # Ready as a load balancer sees it: its start-up warm-up (tokenizers, recent indexes) is done.
        if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
            return
        time.sleep(0.2)
    raise SystemExit(f"the server was not ready within 120 s:\n{log_path.read_text()[-3000:]}")


@contextlib.contextmanager
def started_service(args: argparse.Namespace, var_dir: Path, api_key: str | None) -> Iterator[Service]:
    """migrate, a tenant (unless a kept load brings its key), uvicorn (and a Celery worker with Redis)."""
    env = server_env(args, var_dir)
    manage(env, "migrate", "--noinput")
    if api_key is None:
        slug = f"evidence-recall-{int(time.time())}"
        out = manage(env, "create_tenant", slug, "--name", "evidence recall bench", "--json")
        api_key = json.loads(out.strip().splitlines()[-1])["api_key"]
    port = free_port()
    uvicorn = [str(BIN / "uvicorn"), "config.asgi:application", "--host", HOST, "--port", str(port)]
    uvicorn += ["--lifespan", "off", "--log-level", "warning", "--no-access-log"]
    log_path = var_dir / "server.log"
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(process(uvicorn, env, log_path))
        if args.redis_url:
            worker = [str(BIN / "celery"), "-A", "config", "worker", "-l", "warning"]
            stack.enter_context(process(worker, env, var_dir / "celery.log"))
        url = f"http://{HOST}:{port}"
        wait_ready(url, api_key, server, log_path)
        yield Service(url, api_key, describe_server(args, var_dir), log_path)


def describe_server(args: argparse.Namespace, var_dir: Path) -> str:
    if args.url:
        return f"server: already running at {args.url} (not started here)"
    where = f"uvicorn config.asgi --lifespan off, 1 process, started here; var dir {var_dir}"
    if not args.database_url:
        worker = os.environ.get("MNEMO_EMBEDDED_WORKER") or "process"
        tasks = (
            "in a worker process the server starts" if worker == "process" else "on a thread of the server"
        )
        return f"server: {where}; SQLite embedded, Celery eager, background tasks {tasks}"
    broker = f"Redis {redact(args.redis_url)} with a Celery worker" if args.redis_url else "Celery eager"
    return f"server: {where}; PostgreSQL {redact(args.database_url)}; {broker}"


# --- the kept load -----------------------------------------------------------------------------------------


def manifest_read(var_dir: Path | None) -> dict[str, Any] | None:
    path = var_dir / MANIFEST if var_dir else None
    return json.loads(path.read_text()) if path and path.exists() else None


def manifest_write(var_dir: Path, manifest: dict[str, Any]) -> None:
    path = var_dir / MANIFEST
    path.write_text(json.dumps(manifest, indent=1))
    path.chmod(0o600)  # it holds the API key


def reusable(manifest: dict[str, Any] | None, dataset: Dataset, args: argparse.Namespace) -> bool:
    return bool(
        manifest
        and not args.reload
        and manifest.get("data_sha256") == dataset.sha256
        and manifest.get("server") == identity(args)
    )


def remove_db(var_dir: Path) -> None:
    for name in (*DB_FILES, MANIFEST):
        (var_dir / name).unlink(missing_ok=True)


def delete_conversations(api: Api, conversation_ids: Iterable[str]) -> None:
    """Best effort: a kept load on someone else's server that is being replaced, or a load not kept."""
    for conversation_id in conversation_ids:
        with contextlib.suppress(ApiError, httpx.HTTPError):
            api.call("DELETE", f"/conversations/{conversation_id}")


# --- loading -----------------------------------------------------------------------------------------------


@dataclass
class Load:
    messages: int = 0
    requests: int = 0
    seconds: float = 0.0
    index_seconds: float = 0.0
    index_note: str = ""
    skipped: int = 0  # (conversation, budget) pairs a kept load already held
    warnings: list[str] = field(default_factory=list)


def api_items(conversation: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    items = []
    for m in conversation["messages"]:
        content = m["content"]
        if len(content.encode()) > limit:
            content = content.encode()[:limit].decode(errors="ignore")
        item = {"role": m["role"], "content": content, "created_at": m["created_at"]}
        if m.get("name"):
            item["name"] = m["name"]
        items.append(item)
    return items


def append_failed(exc: ApiError) -> SystemExit:
    if exc.code == "unknown_field" and "created_at" in str(exc):
        return SystemExit(
            f"{exc}\nThis server does not accept created_at on appended messages yet. Update the server "
            "(the append API's created_at support) and run again; the benchmark does not drop the field."
        )
    if exc.code in ("message_too_large", "batch_too_large"):
        return SystemExit(f"{exc}\nSet MNEMO_MAX_MESSAGE_BYTES / MNEMO_MAX_BATCH_MESSAGES to the server's.")
    return SystemExit(f"loading failed: {exc}")


def create_conversation(api: Api, conversation: dict[str, Any], budget: int, load: Load) -> str:
    end_user = f"{conversation['id']}-b{budget}"
    others, _ = api.call("GET", f"/conversations?end_user={end_user}&limit=5")
    if others.get("results"):
        load.warnings.append(
            f"WARNING: end user {end_user} already had conversations (memories may carry over)"
        )
    title = (conversation.get("topic") or {}).get("title") or conversation["id"]
    body = {"end_user": end_user, "title": title[:300], "model": MODEL}
    return api.call("POST", "/conversations", body)[0]["id"]


def append_messages(api: Api, conversation_id: str, conversation: dict[str, Any], load: Load) -> None:
    limits = Limits()
    items = api_items(conversation, limits.message_bytes)
    for start in range(0, len(items), limits.batch):
        batch = {"messages": items[start : start + limits.batch]}
        try:
            api.call("POST", f"/conversations/{conversation_id}/messages", batch)
        except ApiError as exc:
            raise append_failed(exc) from None
        load.requests += 1
    load.messages += len(items)


def load_all(session: Session, dataset: Dataset, budgets: list[int]) -> Load:
    """Each (conversation, budget) pair the manifest lacks; a kept manifest is rewritten after each one, so
    an interrupted load keeps what finished."""
    load = Load()
    started = time.perf_counter()
    for conversation in dataset.conversations:
        kept = session.manifest["conversations"].setdefault(conversation["id"], {})
        for budget in budgets:
            if str(budget) in kept:
                load.skipped += 1
                continue
            conversation_id = create_conversation(session.api, conversation, budget, load)
            session.created.append(conversation_id)
            append_messages(session.api, conversation_id, conversation, load)
            kept[str(budget)] = conversation_id
            if session.keep_dir:
                manifest_write(session.keep_dir, session.manifest)
            log(f"  loaded {conversation['id']} for B={budget} ({time.perf_counter() - started:.0f}s)")
    load.seconds = time.perf_counter() - started
    return load


def readiness(api: Api, ids: list[str]) -> list[dict[str, Any]]:
    return [api.call("GET", f"/conversations/{i}")[0] for i in ids]


def wait_conversations_ready(api: Api, ids: list[str], timeout: float) -> tuple[float, str]:
    """Poll GET /conversations/{id} until every conversation's `readiness` says ready (its vectors, the
    memory agent's reading and any due compaction done), as a client that imported a history would: no
    context call before the questions, no other signal."""
    started, logged = time.monotonic(), 0.0
    while True:
        bodies, waited = readiness(api, ids), time.monotonic() - started
        if any("readiness" not in b for b in bodies):
            return waited, "WARNING: GET /conversations/{id} has no readiness; asked without waiting"
        waiting = Counter(w for b in bodies for w in b["readiness"]["waiting_for"])
        index = [b.get("retrieval_index") or {} for b in bodies]
        model = ", ".join(sorted({str(i.get("model")) for i in index}))
        if not waiting:
            total = sum(i.get("messages", 0) for i in index)
            return (
                waited,
                f"ready after {waited:.0f}s: {total:,} messages, vectors ({model}), memory agent, compaction",
            )
        if waited > timeout:
            return waited, f"WARNING: not ready after {timeout:.0f}s ({dict(waiting)}); asked anyway"
        if waited - logged >= 10:
            done = sum(min(i.get("embedded", 0), i.get("messages", 0)) for i in index)
            total = sum(i.get("messages", 0) for i in index)
            log(f"  waiting for {dict(waiting)}: {done:,}/{total:,} messages embedded ({waited:.0f}s)")
            logged = waited
        time.sleep(2)


# --- asking ------------------------------------------------------------------------------------------------


def call_figures(response: dict[str, Any], ms: float) -> dict[str, Any]:
    b5 = (response.get("blocks") or {}).get("B5") or {}
    scores = [i["score"] for i in b5.get("items") or [] if isinstance(i.get("score"), int | float)]
    timings = response.get("timings") or {}
    return {
        "latency_ms": round(ms, 2),
        "server_ms": round(sum(v for v in timings.values() if isinstance(v, int | float)), 3),
        "timings": timings,
        "tokens_total": (response.get("tokens") or {}).get("total"),
        "b5_tokens": b5.get("tokens", 0),
        "b5_scores": scores,
        "degradations": [d.get("code") for d in response.get("degradations") or []],
        "dropped": [
            {k: d.get(k) for k in ("block", "reason", "tokens")} for d in response.get("dropped") or []
        ],
    }


def evidence_found(response: dict[str, Any], row: dict[str, Any], message_words: Any) -> dict[str, Any]:
    prompt = Prompt.of(response)
    present = [s for s in row["evidence_seqs"] if prompt.holds(message_words(s))]
    er = len(present) / len(row["evidence_seqs"]) if row["scored"] and row["evidence_seqs"] else None
    return {"present_seqs": present, "er": er}


def ask_one(
    api: Api, conversation_id: str, question: dict[str, Any], budget: int, message_words: Any
) -> dict:
    row = {
        "id": question["id"],
        "category": question["category"],
        "budget": budget,
        "scored": bool(question.get("scored")),
        "evidence_seqs": list(question.get("evidence_seqs") or []),
    }
    body = {"user_message": question["question"], "token_budget": budget, "format": "openai"}
    try:
        response, ms = api.call("POST", f"/conversations/{conversation_id}/context", body)
    except ApiError as exc:  # recorded and counted; a dead server (transport error) stops the run
        log(f"  {question['id']} @ {budget}: {exc}")
        return {**row, "error": str(exc), "present_seqs": [], "er": 0.0 if row["scored"] else None}
    return {**row, **call_figures(response, ms), **evidence_found(response, row, message_words)}


def ask_all(api: Api, dataset: Dataset, budgets: list[int], manifest: dict[str, Any]) -> list[dict]:
    rows: list[dict[str, Any]] = []
    for conversation in dataset.conversations:
        texts = {m["seq"]: m["content"] for m in conversation["messages"]}
        cache: dict[int, list[str]] = {}

        def message_words(seq: int, texts: dict = texts, cache: dict = cache) -> list[str]:
            if seq not in cache:
                cache[seq] = words(texts.get(seq, ""))
            return cache[seq]

        for budget in budgets:
            conversation_id = manifest["conversations"][conversation["id"]][str(budget)]
            asked = [
                ask_one(api, conversation_id, q, budget, message_words) for q in conversation["questions"]
            ]
            for row in asked:
                row["conversation"] = conversation["id"]
            rows += asked
            ers = [r["er"] for r in asked if r["er"] is not None]
            er = f"{statistics.fmean(ers):.3f}" if ers else "-"
            log(f"  asked {conversation['id']} @ {budget}: {len(asked)} questions, ER {er}")
    return rows


# --- baselines ---------------------------------------------------------------------------------------------


def baselines(path: Path, dataset: Dataset, budgets: list[int]) -> tuple[Any, Any, int]:
    """The dataset's own recency / BM25 / oracle, on exactly the questions Mnemo is scored on."""
    spec = importlib.util.spec_from_file_location("dataset_baselines", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _, count = module.make_counter("chars")  # len/4
    scored = [
        {**c, "questions": [q for q in c["questions"] if q.get("scored")]} for c in dataset.conversations
    ]
    er, full, _ = module.run(scored, list(budgets), count)
    n = sum(len(v) for v in er["bm25"][budgets[0]].values())
    return er, full, n


# --- report ------------------------------------------------------------------------------------------------


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


@dataclass
class Scores:
    """ER per (method, budget, category); "*" is the macro over questions, "all" the all-evidence share."""

    er: dict[tuple[str, int, str], float]
    categories: list[str]
    n: dict[str, int]


def scores(rows: list[dict[str, Any]], base_er: Any, base_full: Any, budgets: list[int]) -> Scores:
    scored = [r for r in rows if r["er"] is not None]
    categories = sorted({r["category"] for r in scored})
    er: dict[tuple[str, int, str], float] = {}
    for b in budgets:
        mine = [r for r in scored if r["budget"] == b]
        for cat in categories:
            er[("Mnemo", b, cat)] = mean([r["er"] for r in mine if r["category"] == cat])
        er[("Mnemo", b, "*")] = mean([r["er"] for r in mine])
        er[("Mnemo", b, "all")] = mean([float(r["er"] == 1.0) for r in mine])
        for method in ("recency", "bm25", "oracle"):
            for cat in categories:
                er[(method, b, cat)] = mean(base_er[method][b][cat])
            er[(method, b, "*")] = mean([x for v in base_er[method][b].values() for x in v])
            er[(method, b, "all")] = mean([float(x) for x in base_full[method][b]])
    n = Counter(r["category"] for r in scored if r["budget"] == budgets[0])
    return Scores(er, categories, {**n, "*": sum(n.values())})


def er_table(s: Scores, budgets: list[int]) -> str:
    methods = (("Mnemo", "Mnemo"), ("recency", "recency"), ("bm25", "BM25"))
    head = ["category", "n", *[f"{label}@{b}" for b in budgets for _, label in methods]]
    labels = [(c, c) for c in s.categories]
    labels += [("*", "overall (macro over questions)"), ("all", "all evidence included (share)")]
    rows = [
        [
            label,
            str(s.n.get(key, s.n["*"])),
            *[f"{s.er[(m, b, key)]:.3f}" for b in budgets for m, _ in methods],
        ]
        for key, label in labels
    ]
    ceiling = [f"{s.er[('oracle', b, '*')]:.3f}" for b in budgets for _ in methods]
    rows.append(["ceiling: oracle (the evidence alone), overall", str(s.n["*"]), *ceiling])
    return render_table(head, rows)


def margin_table(s: Scores, budgets: list[int]) -> str:
    rows = []
    for b in budgets:
        mine, bm25 = s.er[("Mnemo", b, "*")], s.er[("bm25", b, "*")]
        ratio = f"{mine / bm25:.2f}" if bm25 else "-"
        rows.append([f"{b:,}", f"{mine:.3f}", f"{bm25:.3f}", f"{mine - bm25:+.3f}", ratio])
    return render_table(["budget", "Mnemo ER", "BM25 ER (baseline)", "Mnemo - BM25", "ratio"], rows)


def latency_table(rows: list[dict[str, Any]], budgets: list[int]) -> str:
    out = []
    for b in budgets:
        ok = [r for r in rows if r["budget"] == b and "error" not in r]
        client, server = [r["latency_ms"] for r in ok], [r["server_ms"] for r in ok]
        tokens = [r["tokens_total"] or 0 for r in ok]
        failed = sum(1 for r in rows if r["budget"] == b and "error" in r)
        out.append(
            [f"{b:,}", f"{len(ok)} (+{failed} failed)" if failed else str(len(ok))]
            + [f"{percentile(client, p):.1f}" for p in (50, 95, 100)]
            + [f"{percentile(server, p):.1f}" for p in (50, 95, 100)]
            + [f"{mean(tokens):,.0f}", f"{max(tokens, default=0):,}", str(sum(1 for t in tokens if t > b))]
        )
    head = [
        "budget",
        "calls",
        "client p50 ms",
        "p95 ms",
        "max ms",
        "server timings p50 ms",
        "p95 ms",
        "max ms",
    ]
    return render_table([*head, "tokens.total mean", "max", "calls over budget"], out)


def b5_row(label: str, rows: list[dict[str, Any]], budget: int) -> list[str]:
    tokens = [r["b5_tokens"] for r in rows]
    tops = [max(r["b5_scores"]) for r in rows if r["b5_scores"]]
    return [
        label,
        f"{budget:,}",
        str(len(rows)),
        f"{mean(tokens):,.0f}" if tokens else "-",
        f"{percentile(tokens, 90):,}" if tokens else "-",
        str(sum(1 for t in tokens if t)),
        f"{mean(tops):.3f}" if tops else "- (no scores)",
    ]


def abstention_table(rows: list[dict[str, Any]], budgets: list[int]) -> str:
    out = []
    for b in budgets:
        ok = [r for r in rows if r["budget"] == b and "error" not in r]
        out.append(
            b5_row("abstention (nothing to find)", [r for r in ok if r["category"] == "abstention"], b)
        )
        out.append(b5_row("scored questions", [r for r in ok if r["er"] is not None], b))
    head = ["questions", "budget", "calls", "B5 tokens mean", "p90", "calls with B5", "top B5 score mean"]
    return render_table(head, out)


def degradation_table(rows: list[dict[str, Any]], budgets: list[int]) -> str:
    """Calls per degradation code and per dropped block: nothing the server gave up is silent here."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        for code in set(r.get("degradations") or []):
            counts[f"degradation {code}"][r["budget"]] += 1
        for d in {(d["block"], d["reason"]) for d in r.get("dropped") or []}:
            counts[f"dropped {d[0]} ({d[1]})"][r["budget"]] += 1
    if not counts:
        return "no degradations, nothing dropped"
    body = [[k, *[str(counts[k][b]) for b in budgets]] for k in sorted(counts)]
    return render_table(["calls with", *[f"@{b:,}" for b in budgets]], body)


# --- targets -----------------------------------------------------------------------------------------------


def verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "MISSED")


def category_target(s: Scores, b: int, budgets: list[int]) -> list[str]:
    name = f"no category below BM25 @{b:,}"
    if b not in budgets:
        return [name, "-", verdict(None)]
    below = [c for c in s.categories if s.er[("Mnemo", b, c)] < s.er[("bm25", b, c)] - 1e-9]
    detail = ", ".join(f"{c} {s.er[('Mnemo', b, c)]:.3f} < {s.er[('bm25', b, c)]:.3f}" for c in below)
    measured = (
        f"{len(below)} of {len(s.categories)} below: {detail}" if below else f"none of {len(s.categories)}"
    )
    return [name, measured, verdict(not below)]


def er_target(s: Scores, budgets: list[int], budget: int, floor: float, name: str, bm25: bool) -> list[str]:
    """ER@budget >= floor (plus BM25's ER at that budget when `bm25`)."""
    if budget not in budgets:
        return [name, "-", verdict(None)]
    mine = s.er[("Mnemo", budget, "*")]
    need = floor + (s.er[("bm25", budget, "*")] if bm25 else 0.0)
    measured = f"{mine:.3f} (needs {need:.3f})"
    return [name, measured, verdict(mine >= need)]


def targets(s: Scores, rows: list[dict[str, Any]], budgets: list[int]) -> tuple[str, bool]:
    ok = [r for r in rows if "error" not in r]
    slowest = max((r["latency_ms"] for r in ok), default=0.0)
    slow = sum(1 for r in ok if r["latency_ms"] > TARGET_MAX_MS)
    failed = len(rows) - len(ok)
    table = [
        er_target(s, budgets, 2000, TARGET_ER_2K, f"ER@2000 >= {TARGET_ER_2K} overall", bm25=False),
        er_target(
            s, budgets, 2000, TARGET_MARGIN_2K, f"ER@2000 >= BM25@2000 + {TARGET_MARGIN_2K}", bm25=True
        ),
        er_target(s, budgets, 8000, TARGET_ER_8K, f"ER@8000 >= {TARGET_ER_8K} overall", bm25=False),
        category_target(s, 2000, budgets),
        category_target(s, 8000, budgets),
        [
            f"no context call over {TARGET_MAX_MS:.0f} ms (client side)",
            f"max {slowest:.1f} ms; {slow} of {len(ok)} calls over",
            verdict(slow == 0),
        ],
        ["every context call answered", f"{failed} failed of {len(rows)}", verdict(failed == 0)],
    ]
    return render_table(["target", "measured", "verdict"], table), all(r[2] != "MISSED" for r in table)


# --- header ------------------------------------------------------------------------------------------------


def header(dataset: Dataset, service: Service, load: Load, args: argparse.Namespace, base: Path) -> str:
    convs = dataset.conversations
    messages = sum(len(c["messages"]) for c in convs)
    tokens = sum((len(m["content"]) + 3) // 4 for c in convs for m in c["messages"])
    questions = [q for c in convs for q in c["questions"]]
    scored = sum(1 for q in questions if q.get("scored"))
    abstention = sum(1 for q in questions if q["category"] == "abstention")
    limit = Limits().message_bytes
    notes = truncation_notes(dataset, limit)
    lines = [
        f"data {dataset.path} sha256 {dataset.sha256}",
        f"{len(convs)} of {dataset.total} conversations ({', '.join(c['id'] for c in convs)}): {messages:,} "
        f"messages, {tokens:,} tokens (len/4); {len(questions)} questions asked per budget, {scored} scored, "
        f"{abstention} abstention; budgets {', '.join(f'{b:,}' for b in args.budgets)}",
        *[f"TRUNCATED to MNEMO_MAX_MESSAGE_BYTES: {n}" for n in notes],
        service.describe,
        load_line(load, len(convs) * len(args.budgets)),
        load.index_note,
        *load.warnings,
        f"baselines: {base} (recency, bm25, oracle; len/4 tokens; the untruncated messages), same questions",
    ]
    return machine_header("bench/evidence_recall.py", *lines)


def load_line(load: Load, pairs: int) -> str:
    if load.skipped == pairs:
        return f"loading skipped: all {pairs} conversation x budget pairs were in the kept load (--var-dir)"
    rate = load.messages / load.seconds if load.seconds else 0.0
    kept = f" ({load.skipped} pairs already kept)" if load.skipped else ""
    return (
        f"loaded {pairs - load.skipped} conversation x budget pairs{kept}: {load.messages:,} messages in "
        f"{load.requests} batches of <= {Limits().batch} in {load.seconds:.1f}s = {rate:,.0f} appends/s; "
        f"index wait {load.index_seconds:.1f}s"
    )


# --- the run -----------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--baselines", type=Path, help="baselines.py (default: next to --data, else beam's)")
    parser.add_argument("--conversations", help='a count ("2") or ids / suffixes ("01,04")')
    parser.add_argument("--max-questions", type=int, help="the first N questions of each conversation")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    parser.add_argument("--var-dir", type=Path, help="server data and the manifest of a kept load")
    parser.add_argument("--keep", action="store_true", help="keep the loaded data (needs --var-dir)")
    parser.add_argument("--reload", action="store_true", help="load again even if --var-dir holds a load")
    parser.add_argument("--database-url", help="the started server on this PostgreSQL database")
    parser.add_argument("--redis-url", help="with --database-url: Redis, and a Celery worker")
    parser.add_argument("--url", help="an already running server (with --api-key)")
    parser.add_argument("--api-key")
    parser.add_argument("--index-timeout", type=float, default=1800.0)
    parser.add_argument("--json", type=Path, help="write per-question results here")
    args = parser.parse_args()
    if args.url and not args.api_key:
        parser.error("--url needs --api-key")
    if args.url and args.database_url:
        parser.error("--url and --database-url exclude each other (the running server has its database)")
    if args.redis_url and not args.database_url:
        parser.error("--redis-url needs --database-url")
    if args.keep and not args.var_dir:
        parser.error("--keep needs --var-dir")
    args.budgets = sorted(set(args.budgets))
    default_base = args.data.parent / "baselines.py"
    args.baselines = args.baselines or (default_base if default_base.exists() else DATA_DIR / "baselines.py")
    return args


def workspace(args: argparse.Namespace, stack: contextlib.ExitStack) -> Path | None:
    if args.var_dir:
        args.var_dir.mkdir(parents=True, exist_ok=True)
        return args.var_dir.resolve()
    if args.url:
        return None
    return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mnemo-bench-er-")))


def open_service(
    args: argparse.Namespace, stack: contextlib.ExitStack, var_dir: Path | None, key: Any
) -> Service:
    if args.url:
        return Service(args.url, args.api_key, describe_server(args, var_dir or Path()))
    assert var_dir is not None
    return stack.enter_context(started_service(args, var_dir, key))


@dataclass
class Session:
    service: Service
    api: Api
    manifest: dict[str, Any]  # what is loaded: dataset conversation id -> budget -> Mnemo conversation id
    keep_dir: Path | None  # where the manifest is kept, when the load is kept
    created: list[str] = field(default_factory=list)  # conversations this run created


def prepare(args: argparse.Namespace, dataset: Dataset, stack: contextlib.ExitStack) -> Session:
    """The server, the client, and the manifest of what is loaded (reused from a kept load when it fits)."""
    var_dir = workspace(args, stack)
    old = manifest_read(var_dir)
    reuse = reusable(old, dataset, args)
    keep = args.keep or reuse
    if not reuse and var_dir and not args.url and not args.database_url:
        remove_db(var_dir)  # a fresh SQLite database: nothing of an earlier load can leak into this one
        if args.var_dir and not keep:
            stack.callback(remove_db, var_dir)  # after the server stops (the stack unwinds in reverse)
    service = open_service(args, stack, var_dir, old["api_key"] if reuse and old else None)
    api = Api(service.url, service.api_key)
    stack.callback(api.close)
    if old and not reuse and args.url and old.get("server") == identity(args):
        # The same end users are about to be loaded again.
        loaded = [i for per_budget in old["conversations"].values() for i in per_budget.values()]
        delete_conversations(api, loaded)
    manifest = old if reuse and old else {"data_sha256": dataset.sha256, "server": identity(args)}
    manifest.setdefault("conversations", {})
    manifest["api_key"] = service.api_key
    session = Session(service, api, manifest, var_dir if keep else None)
    if not keep and (args.url or args.database_url):
        stack.callback(delete_conversations, api, session.created)  # before the server stops
    return session


def run(args: argparse.Namespace) -> int:
    dataset = read_dataset(args.data, args.conversations, args.max_questions)
    with contextlib.ExitStack() as stack:
        session = prepare(args, dataset, stack)
        log(f"loading {len(dataset.conversations)} conversations x {len(args.budgets)} budgets …")
        load = load_all(session, dataset, args.budgets)
        loaded = session.manifest["conversations"]
        ids = [loaded[c["id"]][str(b)] for c in dataset.conversations for b in args.budgets]
        load.index_seconds, load.index_note = wait_conversations_ready(session.api, ids, args.index_timeout)
        log(f"asking {sum(len(c['questions']) for c in dataset.conversations)} questions per budget …")
        rows = ask_all(session.api, dataset, args.budgets, session.manifest)
    base_er, base_full, base_n = baselines(args.baselines, dataset, args.budgets)
    s = scores(rows, base_er, base_full, args.budgets)
    head = header(dataset, session.service, load, args, args.baselines)
    if base_n != s.n["*"]:
        head += f"\n# WARNING: baselines scored {base_n} questions, Mnemo {s.n['*']}"
    verdicts, met = targets(s, rows, args.budgets)
    tables = [er_table(s, args.budgets), margin_table(s, args.budgets), latency_table(rows, args.budgets)]
    tables += [abstention_table(rows, args.budgets), degradation_table(rows, args.budgets), verdicts]
    print("\n\n".join([head + "\n" + tables[0], *tables[1:]]))
    if args.json:
        args.json.write_text(json.dumps({"header": head.splitlines(), "results": rows}, indent=1))
    return 0 if met else 1


def interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main() -> int:
    args = parse_args()
    # Ctrl-C and a plain kill both unwind the stack, so the server and its worker are always stopped (a
    # background job may even have inherited SIGINT as ignored).
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    started = time.perf_counter()
    try:
        code = run(args)
    except KeyboardInterrupt:
        log("interrupted; whatever this run started was stopped")
        return 130
    log(f"run took {time.perf_counter() - started:.0f}s ({datetime.now(UTC):%H:%M} UTC)")
    return code


if __name__ == "__main__":
    sys.exit(main())
