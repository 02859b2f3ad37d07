"""Read-only queries on the server's database: what was stored, and when each vector was written."""

from __future__ import annotations

import sqlite3
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg

from bench._soak.stack import Stack


class Store:
    """Read-only queries on the server's database: what was stored, and when each vector was written."""

    def __init__(self, stack: Stack) -> None:
        self.url = stack.env.get("DATABASE_URL", "")
        self.path = stack.var_dir / "db.sqlite3"

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        if self.url:
            with psycopg.connect(self.url) as connection:
                return list(connection.execute(sql).fetchall())

        connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
        try:
            return list(connection.execute(sql).fetchall())
        finally:
            connection.close()

    def backlog(self) -> int:
        return self.rows(
            "SELECT count(*) FROM conversations_message m WHERE m.kind = 'message' AND NOT EXISTS "
            "(SELECT 1 FROM conversations_messagevector v WHERE v.message_id = m.id)"
        )[0][0]

    def messages(self) -> dict[str, tuple[str, int]]:
        rows = self.rows("SELECT id, conversation_id, seq FROM conversations_message")
        return {str(uuid.UUID(str(m))): (str(uuid.UUID(str(c))), s) for m, c, s in rows}

    def vector_times(self) -> dict[str, float]:
        rows = self.rows("SELECT message_id, created_at FROM conversations_messagevector")
        return {str(uuid.UUID(str(m))): _timestamp(t) for m, t in rows}


def _timestamp(value: Any) -> float:
    if isinstance(value, str):  # SQLite: UTC without an offset
        value = datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value.timestamp()
