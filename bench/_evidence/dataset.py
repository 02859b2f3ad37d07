"""The data the evidence benchmark reads: conversations with questions and evidence labels, selected and cut
as the flags ask."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path("/work/shared/data/beam-128k")


DEFAULT_DATA = DATA_DIR / "beam-128k.jsonl"


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
