"""Helpers for the memory tests: block URLs and writes through the API."""

from typing import Any


def blocks_url(external_id: str = "alice", label: str | None = None) -> str:
    base = f"/api/v1/users/{external_id}/memory/blocks"
    return f"{base}/{label}" if label else base


def put_block(
    actor: Any, label: str, value: str, *, version: int | None = None, user: str = "alice", **body: Any
):
    headers = {"HTTP_IF_MATCH": f'"{version}"'} if version is not None else {}
    return actor.client.put(blocks_url(user, label), {"value": value, **body}, format="json", **headers)


def patch_block(actor: Any, label: str, *, version: int | None = None, user: str = "alice", **body: Any):
    headers = {"HTTP_IF_MATCH": f'"{version}"'} if version is not None else {}
    return actor.client.patch(blocks_url(user, label), body, format="json", **headers)


def code(response: Any) -> str:
    return response.json()["error"]["code"]
