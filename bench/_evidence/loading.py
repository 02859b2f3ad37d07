"""Loading the conversations through the append API, then waiting on the readiness the API reports."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench._common import log
from bench._evidence.api import MODEL, Api, ApiError, Limits
from bench._evidence.dataset import Dataset
from bench._evidence.session import Session, manifest_write


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
