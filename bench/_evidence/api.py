"""The public API as a client calls it (httpx), and the server's append limits the load respects."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import httpx

MODEL = "gpt-4o"


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
