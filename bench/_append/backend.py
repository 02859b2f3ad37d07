"""A database under test (PostgreSQL or SQLite), its preparation, and the check that every append was stored
once and numbered without a gap."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from bench._common import log
from bench._server import manage


@dataclass
class Backend:
    label: str
    env: dict[str, str]
    var_dir: Path
    database_url: str = ""  # empty for SQLite


def prepare(backend: Backend) -> str:
    """Migrate and create the bench tenant; returns its API key."""
    started = time.perf_counter()
    manage(backend.env, "migrate", "--noinput")
    created = json.loads(manage(backend.env, "create_tenant", "bench", "--json").strip().splitlines()[-1])
    log(f"[{backend.label}] migrated and created a tenant in {time.perf_counter() - started:.1f}s")
    return created["api_key"]


def verify(backend: Backend, conversation_ids: list[str], keys: set[str]) -> tuple[bool, str]:
    """Messages stored = distinct keys sent, no key twice, every conversation numbered 1..n without a gap."""
    if backend.database_url:
        with psycopg.connect(backend.database_url) as conn:
            rows = conn.execute(
                "SELECT conversation_id::text, seq, idempotency_key FROM conversations_message "
                "WHERE conversation_id = ANY(%s::uuid[])",
                (conversation_ids,),
            ).fetchall()
            last = dict(
                conn.execute(
                    "SELECT id::text, last_seq FROM conversations_conversation WHERE id = ANY(%s::uuid[])",
                    (conversation_ids,),
                ).fetchall()
            )
    else:
        # Django keeps UUIDs as 32 hex digits in SQLite.
        hex_ids = [c.replace("-", "") for c in conversation_ids]
        marks = ",".join("?" * len(hex_ids))
        with contextlib.closing(sqlite3.connect(backend.var_dir / "db.sqlite3")) as conn:
            rows = conn.execute(
                "SELECT conversation_id, seq, idempotency_key FROM conversations_message "
                f"WHERE conversation_id IN ({marks})",
                hex_ids,
            ).fetchall()
            last = dict(
                conn.execute(
                    f"SELECT id, last_seq FROM conversations_conversation WHERE id IN ({marks})", hex_ids
                )
            )
    stored_keys = [row[2] for row in rows]
    problems = []
    if len(rows) != len(keys):
        problems.append(f"{len(rows)} messages for {len(keys)} distinct keys")
    if len(set(stored_keys)) != len(stored_keys):
        problems.append(f"{len(stored_keys) - len(set(stored_keys))} keys stored twice")
    if set(stored_keys) != keys:
        problems.append(
            f"{len(keys - set(stored_keys))} keys missing, {len(set(stored_keys) - keys)} unexpected"
        )
    seqs: dict[str, list[int]] = {}
    for conversation_id, seq, _ in rows:
        seqs.setdefault(str(conversation_id), []).append(seq)
    gapped = [c for c, s in seqs.items() if sorted(s) != list(range(1, len(s) + 1)) or last.get(c) != len(s)]
    if gapped:
        problems.append(f"{len(gapped)} conversations with a gap, a duplicate or a stale last_seq")
    if problems:
        return False, "; ".join(problems)
    return True, f"{len(rows)} msgs = {len(keys)} keys, {len(seqs)} convs gapless 1..n"
