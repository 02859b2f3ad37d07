"""A run's session: the server, its client, and the manifest of what is loaded, reused from a kept load when
it fits."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._evidence.api import Api, ApiError
from bench._evidence.dataset import Dataset
from bench._evidence.service import Service, identity, open_service, workspace

MANIFEST = "evidence_recall_manifest.json"


DB_FILES = ("db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm", "db.sqlite3-journal")


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
