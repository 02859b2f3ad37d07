"""The soak's clients: each one an agent loop on a conversation of its own, mixing the API's calls by
weight."""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

BUDGETS = [1000, 4000, 16000]


# What a client does next, with its weight: mostly appends and context calls, as an agent loop makes them.
ACTIONS = {
    "append": 40,
    "append_batch": 12,
    "context": 26,
    "proxy_stream": 8,
    "memory_edit": 6,
    "import_transcript": 4,
    "document": 4,
}


WORDS = [
    "deploy", "export", "invoice", "ledger", "queue", "worker", "retry", "cache", "token", "budget",
    "summary", "migration", "schema", "index", "latency", "staging", "billing", "report", "storage",
    "timeout", "customer", "session", "audit", "usage", "Priya", "Jonas", "Mei", "Luca",
]  # fmt: skip


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 40))]
    return " ".join(words).capitalize() + f" (ticket {rng.randint(100, 99999)})."


@dataclass
class Record:
    endpoint: str
    status: int
    ms: float
    html: bool
    # The server's Server-Timing (config.ops): waiting for a thread after it received the request, then the
    # middleware and the view; None when the response did not say.
    queue_ms: float | None = None
    app_ms: float | None = None
    cpu_ms: float | None = None  # what the request's thread ran of app_ms
    at: float = field(default_factory=time.monotonic)  # when the answer came (the report's minutes)


_TIMING = re.compile(r"(queue|app|cpu);dur=([0-9.]+)")


def server_timing(response: httpx.Response) -> dict[str, float]:
    return {name: float(ms) for name, ms in _TIMING.findall(response.headers.get("server-timing", ""))}


@dataclass
class Shared:
    url: str
    key: str
    deadline: float
    interval: float  # seconds between one client's requests
    names: bool
    actions: dict[str, int] = field(default_factory=lambda: dict(ACTIONS))
    upstream_model: str = "gpt-4o"
    records: list[Record] = field(default_factory=list)
    acked: dict[str, float] = field(default_factory=dict)  # message id -> when its append was answered
    conversations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Client:
    def __init__(self, shared: Shared, n: int) -> None:
        self.shared, self.n = shared, n
        self.rng = random.Random(n)
        self.http = httpx.Client(
            base_url=shared.url, timeout=60, headers={"Authorization": f"Bearer {shared.key}"}
        )
        self.user = f"user-{n}"
        self.conversation = ""
        self.proxy_conversation = ""
        self.turn = 0

    def call(self, endpoint: str, method: str, path: str, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            response = self.http.request(method, path, **kwargs)
        except Exception as exc:  # a refused or dropped connection counts as a failure, status 0
            self.shared.records.append(Record(endpoint, 0, (time.perf_counter() - started) * 1000, False))
            self.shared.errors.append(f"{endpoint}: {exc!r}")
            return None
        ms = (time.perf_counter() - started) * 1000
        html = response.headers.get("content-type", "").startswith("text/html")
        timing = server_timing(response)
        queue, app, cpu = (timing.get(name) for name in ("queue", "app", "cpu"))
        record = Record(endpoint, response.status_code, ms, html, queue, app, cpu)
        self.shared.records.append(record)
        if response.status_code >= 500:
            self.shared.errors.append(f"{endpoint} {response.status_code}: {response.text[:300]}")
        return response

    def run(self) -> None:
        created = self.call("conversation", "POST", "/api/v1/conversations", json={"end_user": self.user})
        self.conversation = created.json()["id"]
        self.shared.conversations.append(self.conversation)
        actions, weights = list(self.shared.actions), list(self.shared.actions.values())
        while time.monotonic() < self.shared.deadline:
            began = time.monotonic()
            getattr(self, self.rng.choices(actions, weights)[0])()
            time.sleep(
                max(0.0, self.rng.uniform(0.5, 1.5) * self.shared.interval - (time.monotonic() - began))
            )
        self.http.close()

    def message(self, role: str) -> dict[str, Any]:
        item = {"role": role, "content": sentence(self.rng), "created_at": datetime.now(UTC).isoformat()}
        if self.shared.names:
            item["name"] = f"agent-{self.n}" if role == "assistant" else f"person-{self.n}"
        return item

    def _ack(self, messages: list[dict[str, Any]]) -> None:
        now = time.time()
        for message in messages:
            self.shared.acked[message["id"]] = now

    def append(self) -> None:
        self.turn += 1
        body = self.message("user" if self.turn % 2 else "assistant")
        response = self.call(
            "append", "POST", f"/api/v1/conversations/{self.conversation}/messages", json=body
        )
        if response is not None and response.status_code in (200, 201):
            self._ack([response.json()])

    def append_batch(self) -> None:
        items = [self.message(("user", "assistant")[i % 2]) for i in range(self.rng.randint(2, 6))]
        path = f"/api/v1/conversations/{self.conversation}/messages"
        response = self.call("append_batch", "POST", path, json={"messages": items})
        if response is not None and response.status_code in (200, 201):
            self._ack(response.json()["messages"])

    def context(self) -> None:
        budget = BUDGETS[self.rng.randrange(len(BUDGETS))]
        body = {"user_message": sentence(self.rng), "token_budget": budget}
        self.call(
            f"context {budget}", "POST", f"/api/v1/conversations/{self.conversation}/context", json=body
        )

    def proxy_stream(self) -> None:
        """A streamed chat completion on a conversation of the proxy's own (its turns are not counted as
        this client's acknowledged appends)."""
        messages = [{"role": "user", "content": sentence(self.rng)}]
        headers = {"X-Mnemo-User": self.user}
        if self.proxy_conversation:
            headers["X-Mnemo-Conversation"] = self.proxy_conversation
        body = {"model": self.shared.upstream_model, "messages": messages, "stream": True}
        started = time.perf_counter()
        try:
            with self.http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                text = "".join(response.iter_text())
                status = response.status_code
                html = response.headers.get("content-type", "").startswith("text/html")
                self.proxy_conversation = response.headers.get(
                    "x-mnemo-conversation", self.proxy_conversation
                )
        except Exception as exc:
            status, html, text = 0, False, repr(exc)
        self.shared.records.append(
            Record("proxy_stream", status, (time.perf_counter() - started) * 1000, html)
        )
        if status >= 500 or status == 0 or '"error"' in text:
            self.shared.errors.append(f"proxy_stream {status}: {text[:300]}")

    def memory_edit(self) -> None:
        """A support-style edit of a core memory block: created once, then replaced at its version."""
        path = f"/api/v1/users/{self.user}/memory/blocks/notes"
        line = f"Prefers build {self.rng.randint(1, 999)} reports on {self.rng.choice(WORDS)}."
        current = self.call("memory_read", "GET", path)
        if current is None:
            return
        if current.status_code == 404:
            self.call("memory_edit", "PUT", path, json={"value": line})
            return
        headers = {"If-Match": current.headers.get("ETag", "")}
        self.call("memory_edit", "PATCH", path, json={"value": line, "reason": "soak"}, headers=headers)

    def import_transcript(self) -> None:
        exported = self.call("export", "GET", f"/api/v1/conversations/{self.conversation}/transcript.jsonl")
        if exported is None or exported.status_code != 200:
            return
        lines = exported.text.splitlines()[:41]  # the header and up to 40 messages
        self.call(
            "import",
            "POST",
            "/api/v1/conversations/import",
            content="\n".join(lines).encode(),
            headers={"Content-Type": "application/x-ndjson"},
        )

    def document(self) -> None:
        text = "\n\n".join(sentence(self.rng) for _ in range(self.rng.randint(5, 30)))
        files = {"file": (f"notes-{self.n}-{self.rng.randint(0, 10**6)}.md", text.encode(), "text/markdown")}
        self.call("document", "POST", "/api/v1/documents", files=files, data={"end_user": self.user})


def names_accepted(url: str, key: str) -> bool:
    """One probe append with a speaker name: a server without the field refuses it as an unknown field."""
    headers = {"Authorization": f"Bearer {key}"}
    conversation = httpx.post(f"{url}/api/v1/conversations", json={}, headers=headers, timeout=30).json()[
        "id"
    ]
    probe = {"role": "user", "content": "probe", "name": "probe"}
    answer = httpx.post(f"{url}/api/v1/conversations/{conversation}/messages", json=probe, headers=headers)
    httpx.delete(f"{url}/api/v1/conversations/{conversation}", headers=headers, timeout=30)
    if answer.status_code == 400 and "unknown_field" in answer.text:
        return False
    if answer.status_code not in (200, 201):
        raise SystemExit(f"the probe append failed: {answer.status_code} {answer.text[:300]}")
    return True


def warm_up(url: str, key: str) -> None:
    """Before the clock starts: one message embedded in the background and one context call, so the model
    is loaded where it runs (the worker, the server) and a fresh var dir's int8 model is built. A user's
    server has done this long before."""
    headers = {"Authorization": f"Bearer {key}"}
    base = f"{url}/api/v1/conversations"
    conversation = httpx.post(base, json={}, headers=headers, timeout=60).json()["id"]
    probe = {"role": "user", "content": "The staging ledger listens on port 23456."}
    httpx.post(f"{base}/{conversation}/messages", json=probe, headers=headers, timeout=60)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        index = httpx.get(f"{base}/{conversation}", headers=headers, timeout=60).json()["retrieval_index"]
        if index["embedded"] >= 1:
            break
        time.sleep(0.5)
    question = {"user_message": "Which port does the ledger use?", "token_budget": 2000}
    httpx.post(f"{base}/{conversation}/context", json=question, headers=headers, timeout=120)
    httpx.delete(f"{base}/{conversation}", headers=headers, timeout=60)


def quiet_context_ms(shared: Shared, calls: int = 96) -> list[float]:
    """The baseline of the context figure, in the same run: once the load has stopped and the backlog has
    drained, one client asks the soak's conversations (the data the load left) new questions at the same
    budgets, one call after another, on a server with nothing else to do."""
    rng = random.Random(0)
    ms = []
    headers = {"Authorization": f"Bearer {shared.key}"}
    with httpx.Client(base_url=shared.url, timeout=60, headers=headers) as http:
        for n in range(calls):
            conversation = shared.conversations[n % len(shared.conversations)]
            body = {"user_message": sentence(rng), "token_budget": BUDGETS[n % len(BUDGETS)]}
            started = time.perf_counter()
            response = http.post(f"/api/v1/conversations/{conversation}/context", json=body)
            if response.status_code == 200:
                ms.append((time.perf_counter() - started) * 1000)
    return ms
