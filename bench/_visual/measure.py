"""The visual benchmark's measurements: a session played through the services, then the tokens, the dedup,
the hashing and the tier reads it left.

Imported once django_setup() has run: it imports the apps at module level.
"""

from __future__ import annotations

import base64
import hashlib
import io
import random
import time
from collections.abc import Callable
from typing import Any

from PIL import Image

from bench._common import MODEL, log
from bench._visual.screens import WORDS, H, Step, W, session
from cold_storage.imaging import hamming, hash_frame
from cold_storage.models import ArchivedImage
from cold_storage.selectors import image_bytes
from conversations import visual
from conversations.models import Message
from conversations.parts import iter_image_parts
from conversations.services import conversation_create, message_append_batch, turn_end, turn_start
from providers.images import image_tokens
from tenants.services import tenant_create


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - started


def step_items(number: int, step: Step) -> list[dict[str, Any]]:
    """A screenshot tool call and its result carrying the frame."""
    call = {
        "role": "assistant",
        "parts": [
            {
                "type": "tool_call",
                "id": f"c{number}",
                "name": "computer",
                "arguments": {"action": "screenshot"},
            }
        ],
    }
    result = {
        "role": "tool",
        "is_error": step.error,
        "parts": [
            {"type": "tool_result", "tool_call_id": f"c{number}", "content": "done"},
            {"type": "image", "data": base64.b64encode(step.png).decode(), "media_type": "image/png"},
        ],
    }
    return [call, result]


def play(conversation: Any, plan: list[list[Step]]) -> dict[str, list[float]]:
    """Every turn through the services; the seconds of each append, turn end and compaction that ran."""
    times: dict[str, list[float]] = {"compact": [], "end": [], "append": []}
    real_compact = visual.turn_compact

    def timed_compact(**kwargs: Any) -> Any:
        result, seconds = timed(real_compact, **kwargs)
        if result is not None:
            times["compact"].append(seconds)
        return result

    visual.turn_compact = timed_compact
    try:
        for turn_steps in plan:
            turn = turn_start(conversation=conversation)
            words = "Go on with the task: " + random.Random(len(times["append"])).choice(WORDS)
            message_append_batch(conversation=conversation, items=[{"role": "user", "content": words}])
            for number, step in enumerate(turn_steps):
                items = step_items(number, step)
                times["append"].append(timed(message_append_batch, conversation=conversation, items=items)[1])
            times["end"].append(timed(turn_end, turn=turn)[1])
    finally:
        visual.turn_compact = real_compact
    return times


def plain_turn_ends(tenant: Any, turns: int) -> list[float]:
    """Baseline turn end: the same number of turns, without images."""
    plain = conversation_create(tenant=tenant, model=MODEL)
    seconds = []
    for _ in range(turns):
        turn = turn_start(conversation=plain)
        message_append_batch(conversation=plain, items=[{"role": "user", "content": "hello"}])
        seconds.append(timed(turn_end, turn=turn)[1])
    return seconds


def token_figures(conversation: Any, frames: list[Step], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Image tokens of the history as the model now sees it vs every frame kept at full price."""
    messages = list(Message.objects.filter(conversation=conversation).order_by("seq"))
    tenant_id = conversation.tenant_id
    compacted = [p for p in parts if p.get("compacted")]
    placeholder = visual.parts_image_tokens(compacted, tenant_id=tenant_id, model=MODEL)
    return {
        "mnemo_tokens": sum(
            visual.parts_image_tokens(m.parts, tenant_id=tenant_id, model=MODEL) for m in messages
        ),
        "baseline_tokens": len(frames) * image_tokens(width=W, height=H, model=MODEL),
        "kept": len([p for p in parts if "duplicate_of" not in p and not p.get("compacted")]),
        "dups": len([p for p in parts if "duplicate_of" in p]),
        "placeholder_tokens": placeholder / max(1, len(compacted)),
        "compacted": len(compacted),
    }


def dedup_figures(frames: list[Step], parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Per frame: was it stored as a duplicate, and did the screen truly change (other bytes than the
    previous frame)? Also the seed's rule alone (pHash within 10 of the previous frame), for comparison with
    the grid guard."""
    changed = [i for i in range(1, len(frames)) if frames[i].png != frames[i - 1].png]
    unchanged = [i for i in range(1, len(frames)) if frames[i].png == frames[i - 1].png]
    is_dup = ["duplicate_of" in p for p in parts]
    by_kind: dict[str, list[int]] = {}
    for i in changed:
        by_kind.setdefault(frames[i].change, []).append(int(is_dup[i]))
    phash_of = {r.sha256: r.phash for r in ArchivedImage.objects.all()}
    ph = [phash_of[hashlib.sha256(s.png).hexdigest()] for s in frames]
    return {
        "sha_dups": len(unchanged),
        "changed": len(changed),
        "unchanged": len(unchanged),
        "unchanged_dedup": sum(is_dup[i] for i in unchanged),
        "false_dups": len([i for i in changed if is_dup[i]]),
        "by_kind": {k: (sum(v), len(v)) for k, v in sorted(by_kind.items())},
        "phash_only_false": sum(1 for i in changed if hamming(ph[i], ph[i - 1]) <= 10),
        "phash_only_dups": sum(1 for i in range(1, len(frames)) if hamming(ph[i], ph[i - 1]) <= 10),
    }


def hash_figures(frames: list[Step]) -> dict[str, Any]:
    """Hashing the reduced frame (what intake does) vs the full frame, and how far apart the hashes are."""
    sample = [Image.open(io.BytesIO(p)) for p in list({s.png: None for s in frames})[:40]]
    for image in sample:
        image.load()
    reduced_t, full_t = [], []
    drift: dict[str, list[int]] = {"phash": [], "dhash": [], "ahash": []}
    for image in sample:
        small, seconds = timed(hash_frame, image)
        reduced_t.append(seconds)
        big, seconds = timed(hash_frame, image, reduce=1)
        full_t.append(seconds)
        for name, a, b in zip(("phash", "dhash", "ahash"), small[:3], big[:3], strict=True):
            drift[name].append(hamming(a, b))
    decode_t = [timed(lambda data: Image.open(io.BytesIO(data)).load(), s.png)[1] for s in frames[:40]]
    return {"hash_reduced": reduced_t, "hash_full": full_t, "drift": drift, "decode": decode_t}


def read_figures() -> dict[str, Any]:
    """Reads: cold tier vs hot tier, sha256 check included."""
    cold_rows = list(
        ArchivedImage.objects.filter(tier="cold", purged_at__isnull=True).exclude(storage_key="")[:60]
    )
    hot_rows = list(ArchivedImage.objects.filter(tier="hot").exclude(storage_key="")[:60])
    for row in cold_rows + hot_rows:  # warm the page cache the same way for both
        image_bytes(row)
    return {
        "cold": [min(timed(image_bytes, r)[1] for _ in range(3)) for r in cold_rows],
        "hot": [min(timed(image_bytes, r)[1] for _ in range(3)) for r in hot_rows],
        "stored_bytes": sum(r.size for r in ArchivedImage.objects.exclude(storage_key="")),
    }


def run(turns: int, seed: int) -> dict[str, Any]:
    log(f"drawing a {turns}-turn session …")
    plan = session(turns, seed)
    frames = [step for turn in plan for step in turn]
    log(f"{len(frames)} frames ({len({s.png for s in frames})} distinct), appending through the services …")
    tenant, _ = tenant_create(slug=f"bench-{seed}", name="Bench")
    conversation = conversation_create(tenant=tenant, model=MODEL)
    times = play(conversation, plan)
    plain_end = plain_turn_ends(tenant, len(plan))
    messages = Message.objects.filter(conversation=conversation).order_by("seq")
    parts = [p for m in messages for p in iter_image_parts(m.parts)]
    assert len(parts) == len(frames)
    return {
        "frames": len(frames),
        "turns": len(plan),
        "distinct": len({s.png for s in frames}),
        **token_figures(conversation, frames, parts),
        **dedup_figures(frames, parts),
        **times,
        "plain_end": plain_end,
        **hash_figures(frames),
        **read_figures(),
        "received_bytes": sum(len(s.png) for s in frames),
        "errors": sum(s.error for s in frames),
    }
