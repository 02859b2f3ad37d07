"""Visual memory on a generated computer-use session, each figure against a baseline from the same run.

The session: 50 turns of 3–8 steps, one 1920×1080 UI-like screenshot per step drawn with Pillow (a window
with a sidebar, a form, a list and a status bar). Between steps the screen changes a little (typing, a
checkbox, a hover, a scroll), sometimes a lot (another page, a dialog), sometimes not at all (the same
frame again), and now and then an error dialog appears (the step's message is is_error). The generator knows
which frames truly differ from the previous one, so the hash's false duplicates can be counted.

Everything goes through the real services (message_append_batch, turn_start/turn_end, the context pipeline)
on an embedded SQLite database and file tiers in a temporary folder, removed at the end.

Figures: image tokens of the history after the 50 turns (gpt-4o rule) with no compaction and no dedup vs
Mnemo; frames stored with pixels; the dedup rate (vs exact sha256 dedup); false duplicates among frames that
truly changed; turn end with compaction vs a turn end without images; hashing on the reduced frame vs the
full frame (and how far apart the two hashes are); cold-tier read vs hot-tier read (sha256 check included).

Run from the repository root:  .venv/bin/python bench/visual.py   [--turns 50] [--seed 7] [--quick]
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
W, H = 1920, 1080
MODEL = "gpt-4o"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the session -----------------------------------------------------------------------------------------

PAGES = ["Inbox", "Settings", "Billing", "Reports", "Users", "Editor", "Search", "Calendar"]
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
]


@dataclass
class Screen:
    """What the UI shows; a frame is drawn from it, so equal screens give byte-identical frames."""

    page: int = 0
    typed: str = ""
    checked: tuple[bool, ...] = (False, False, False, False)
    hover: int = -1
    scroll: int = 0
    dialog: str = ""  # "" | "confirm" | "error"

    def copy(self, **changes: object) -> Screen:
        return Screen(**{**self.__dict__, **changes})


def draw(screen: Screen) -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (W, H), (246, 247, 249))
    d = ImageDraw.Draw(image)
    d.rectangle([0, 0, W, 48], fill=(32, 36, 48))
    d.text((20, 16), f"Acme Console — {PAGES[screen.page]}", fill=(240, 240, 240))
    d.rectangle([0, 48, 280, H - 32], fill=(228, 231, 238))
    for i, name in enumerate(PAGES):
        if i == screen.page:
            d.rectangle([0, 60 + i * 44, 280, 100 + i * 44], fill=(200, 210, 235))
        d.text((24, 72 + i * 44), name, fill=(20, 24, 32))
    rng = random.Random(screen.page * 1000 + screen.scroll)
    # The page body: a heading, a form and a list, different on every page.
    d.text((320, 80), f"{PAGES[screen.page]} overview", fill=(10, 10, 10))
    d.rectangle([320, 130, 1100, 176], outline=(120, 120, 130), fill=(255, 255, 255))
    d.text((332, 146), screen.typed or "Search…", fill=(20, 20, 20) if screen.typed else (150, 150, 150))
    for i, checked in enumerate(screen.checked):
        y = 210 + i * 40
        d.rectangle(
            [320, y, 344, y + 24], outline=(90, 90, 90), fill=(40, 110, 220) if checked else (255, 255, 255)
        )
        d.text((356, y + 6), f"Option {i + 1}: {WORDS[(screen.page + i) % len(WORDS)]}", fill=(30, 30, 30))
    for row in range(16):
        y = 400 + row * 36
        if row == screen.hover:
            d.rectangle([320, y - 4, W - 40, y + 28], fill=(225, 235, 250))
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(4, 12)))
        d.text((332, y + 4), f"{row + screen.scroll:03d}  {words}", fill=(40, 40, 40))
        d.rectangle([W - 400, y + 2, W - 400 + rng.randrange(20, 300), y + 20], fill=(120, 170, 120))
    d.rectangle([0, H - 32, W, H], fill=(220, 222, 228))
    d.text((20, H - 24), f"Ready — {len(screen.typed)} characters", fill=(60, 60, 60))
    if screen.dialog:
        error = screen.dialog == "error"
        d.rectangle(
            [660, 340, 1260, 700],
            fill=(255, 255, 255),
            outline=(200, 40, 40) if error else (90, 90, 90),
            width=4,
        )
        d.rectangle([660, 340, 1260, 392], fill=(200, 40, 40) if error else (60, 90, 160))
        d.text((684, 356), "Error" if error else "Confirm", fill=(255, 255, 255))
        d.text(
            (684, 440),
            "The operation failed: permission denied." if error else "Apply these changes?",
            fill=(0, 0, 0),
        )
        d.rectangle([1080, 620, 1230, 670], fill=(60, 90, 160))
        d.text((1120, 636), "OK", fill=(255, 255, 255))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


SMALL = ("type", "check", "hover")
LARGE = ("page", "scroll", "dialog")


def next_screen(screen: Screen, rng: random.Random) -> tuple[Screen, str]:
    """The next screen and what happened: "same", a small change, a large one, or "error"."""
    if screen.dialog:
        return screen.copy(dialog=""), "dialog"  # closing a dialog
    roll = rng.random()
    if roll < 0.15:
        return screen, "same"
    if roll < 0.22:
        return screen.copy(dialog="error"), "error"
    if roll < 0.45:
        return screen.copy(typed=(screen.typed + " " + rng.choice(WORDS)).strip()[-60:]), "type"
    if roll < 0.55:
        i = rng.randrange(4)
        checked = tuple(not c if j == i else c for j, c in enumerate(screen.checked))
        return screen.copy(checked=checked), "check"
    if roll < 0.65:
        return screen.copy(hover=rng.randrange(16)), "hover"
    if roll < 0.78:
        return screen.copy(scroll=screen.scroll + rng.choice((8, 16))), "scroll"
    if roll < 0.88:
        return screen.copy(dialog="confirm"), "dialog"
    return screen.copy(page=rng.randrange(len(PAGES)), typed="", hover=-1, scroll=0), "page"


@dataclass
class Step:
    png: bytes
    change: str  # "same", "start" (turn's first frame, same screen as before) or the kind of change
    error: bool


def session(turns: int, seed: int) -> list[list[Step]]:
    rng = random.Random(seed)
    screen = Screen()
    cache: dict[str, bytes] = {}
    out = []
    for _ in range(turns):
        steps = []
        for index in range(rng.randint(3, 8)):
            if index == 0:
                change = "start"  # the agent looks at the screen as the previous turn left it
            else:
                screen, change = next_screen(screen, rng)
            key = repr(screen.__dict__)
            if key not in cache:
                cache[key] = draw(screen)
            steps.append(Step(cache[key], change, change == "error"))
        out.append(steps)
    return out


# --- measuring -------------------------------------------------------------------------------------------


def setup_django(var_dir: Path) -> None:
    os.environ["MNEMO_VAR_DIR"] = str(var_dir)
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_TASK_ALWAYS_EAGER"):
        os.environ.pop(name, None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.django.local"
    os.environ.setdefault("MNEMO_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def timed(fn, *args, **kwargs):
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - started


def run(turns: int, seed: int) -> dict:
    from cold_storage.imaging import hamming, hash_frame
    from cold_storage.models import ArchivedImage
    from cold_storage.selectors import image_bytes
    from conversations import visual
    from conversations.models import Message
    from conversations.parts import iter_image_parts
    from conversations.services import conversation_create, message_append_batch, turn_end, turn_start
    from providers.images import image_tokens
    from tenants.services import tenant_create

    log(f"drawing a {turns}-turn session …")
    plan = session(turns, seed)
    frames = [step for turn in plan for step in turn]
    log(f"{len(frames)} frames ({len({s.png for s in frames})} distinct), appending through the services …")

    tenant, _ = tenant_create(slug=f"bench-{seed}", name="Bench")
    conversation = conversation_create(tenant=tenant, model=MODEL)

    compact_times: list[float] = []
    real_compact = visual.turn_compact

    def timed_compact(**kwargs):
        result, seconds = timed(real_compact, **kwargs)
        if result is not None:
            compact_times.append(seconds)
        return result

    visual.turn_compact = timed_compact
    end_times: list[float] = []
    append_times: list[float] = []
    for turn_steps in plan:
        turn = turn_start(conversation=conversation)
        message_append_batch(
            conversation=conversation,
            items=[
                {
                    "role": "user",
                    "content": "Go on with the task: " + random.Random(len(append_times)).choice(WORDS),
                }
            ],
        )
        for number, step in enumerate(turn_steps):
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
            _, seconds = timed(message_append_batch, conversation=conversation, items=[call, result])
            append_times.append(seconds)
        _, seconds = timed(turn_end, turn=turn)
        end_times.append(seconds)
    visual.turn_compact = real_compact

    # Baseline turn end: the same number of turns, without images.
    plain = conversation_create(tenant=tenant, model=MODEL)
    plain_end_times = []
    for _ in plan:
        turn = turn_start(conversation=plain)
        message_append_batch(conversation=plain, items=[{"role": "user", "content": "hello"}])
        _, seconds = timed(turn_end, turn=turn)
        plain_end_times.append(seconds)

    # Image tokens of the history as the model now sees it vs every frame kept at full price.
    messages = list(Message.objects.filter(conversation=conversation).order_by("seq"))
    tenant_id = conversation.tenant_id
    mnemo_tokens = sum(visual.parts_image_tokens(m.parts, tenant_id=tenant_id, model=MODEL) for m in messages)
    baseline_tokens = len(frames) * image_tokens(width=W, height=H, model=MODEL)
    parts = [p for m in messages for p in iter_image_parts(m.parts)]
    kept = [p for p in parts if "duplicate_of" not in p and not p.get("compacted")]
    dups = [p for p in parts if "duplicate_of" in p]
    assert len(parts) == len(frames)

    # Dedup quality: per frame, was it stored as a duplicate, and did the screen truly change (other bytes
    # than the previous frame)?
    changed = [i for i in range(1, len(frames)) if frames[i].png != frames[i - 1].png]
    unchanged = [i for i in range(1, len(frames)) if frames[i].png == frames[i - 1].png]
    is_dup = ["duplicate_of" in p for p in parts]
    false_dups = [i for i in changed if is_dup[i]]
    by_kind: dict[str, list[int]] = {}
    for i in changed:
        by_kind.setdefault(frames[i].change, []).append(int(is_dup[i]))
    sha_dups = len(unchanged)
    # The seed's rule alone (pHash within 10 of the previous frame), for comparison with the grid guard.
    from cold_storage.models import ArchivedImage as Row

    phash_of = {r.sha256: r.phash for r in Row.objects.all()}
    import hashlib

    ph = [phash_of[hashlib.sha256(s.png).hexdigest()] for s in frames]
    phash_only_false = sum(1 for i in changed if hamming(ph[i], ph[i - 1]) <= 10)
    phash_only_dups = sum(1 for i in range(1, len(frames)) if hamming(ph[i], ph[i - 1]) <= 10)
    compacted = [p for p in parts if p.get("compacted")]
    placeholder_tokens = visual.parts_image_tokens(compacted, tenant_id=tenant_id, model=MODEL) / max(
        1, len(compacted)
    )

    # Hashing: the reduced frame (what intake does) vs the full frame; and how far apart the hashes are.
    from PIL import Image

    sample = [Image.open(io.BytesIO(p)) for p in list({s.png: None for s in frames})[:40]]
    for image in sample:
        image.load()
    reduced_t, full_t, drift = [], [], {"phash": [], "dhash": [], "ahash": []}
    for image in sample:
        small, seconds = timed(hash_frame, image)
        reduced_t.append(seconds)
        big, seconds = timed(hash_frame, image, reduce=1)
        full_t.append(seconds)
        for name, a, b in zip(("phash", "dhash", "ahash"), small[:3], big[:3], strict=True):
            drift[name].append(hamming(a, b))
    decode_t = [timed(lambda data: Image.open(io.BytesIO(data)).load(), s.png)[1] for s in frames[:40]]

    # Reads: cold tier vs hot tier, sha256 check included.
    cold_rows = list(
        ArchivedImage.objects.filter(tier="cold", purged_at__isnull=True).exclude(storage_key="")[:60]
    )
    hot_rows = list(ArchivedImage.objects.filter(tier="hot").exclude(storage_key="")[:60])
    for row in cold_rows + hot_rows:  # warm the page cache the same way for both
        image_bytes(row)
    cold_t = [min(timed(image_bytes, r)[1] for _ in range(3)) for r in cold_rows]
    hot_t = [min(timed(image_bytes, r)[1] for _ in range(3)) for r in hot_rows]

    return {
        "frames": len(frames),
        "turns": len(plan),
        "distinct": len({s.png for s in frames}),
        "mnemo_tokens": mnemo_tokens,
        "baseline_tokens": baseline_tokens,
        "kept": len(kept),
        "dups": len(dups),
        "sha_dups": sha_dups,
        "changed": len(changed),
        "unchanged": len(unchanged),
        "unchanged_dedup": sum(is_dup[i] for i in unchanged),
        "false_dups": len(false_dups),
        "by_kind": {k: (sum(v), len(v)) for k, v in sorted(by_kind.items())},
        "compact": compact_times,
        "end": end_times,
        "plain_end": plain_end_times,
        "append": append_times,
        "hash_reduced": reduced_t,
        "hash_full": full_t,
        "drift": drift,
        "decode": decode_t,
        "cold": cold_t,
        "hot": hot_t,
        "stored_bytes": sum(r.size for r in ArchivedImage.objects.exclude(storage_key="")),
        "received_bytes": sum(len(s.png) for s in frames),
        "errors": sum(s.error for s in frames),
        "phash_only_false": phash_only_false,
        "phash_only_dups": phash_only_dups,
        "placeholder_tokens": placeholder_tokens,
        "compacted": len(compacted),
    }


# --- report ------------------------------------------------------------------------------------------------


def header(args: argparse.Namespace) -> str:
    from bench._common import machine_header

    return machine_header(
        "bench/visual.py",
        f"session: {args.turns} turns, 3–8 steps each, {W}×{H} PNG frames, seed {args.seed}; "
        f"model {MODEL}; embedded SQLite, file tiers, eager Celery",
    )


def ms(values: list[float]) -> str:
    return f"{statistics.mean(values) * 1e3:.2f} ms"


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


def _ratio(ours: float, base: float, *, pct: bool = False) -> str:
    if not base:
        return "—"
    # Two decimals: the target (−97 %) sits close to what one decimal would round onto.
    return f"{(ours / base - 1) * 100:+.2f} %" if pct else f"{ours / base:.2f}×"


TableRow = tuple[str, str, str, str]  # figure, Mnemo, baseline, ratio


def table(r: dict) -> str:
    rows = [*_token_rows(r), *_dedup_rows(r), *_time_rows(r)]
    head = ("figure", "Mnemo", "baseline", "ratio")
    widths = [max(len(row[i]) for row in [*rows, head]) for i in range(4)]
    line = "| " + " | ".join(f"{{:{w}}}" for w in widths) + " |"
    out = [line.format(*head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line.format(*row) for row in rows]
    return "\n".join(out)


def _token_rows(r: dict) -> list[TableRow]:
    """Image tokens in the history, what the model sees as pixels, bytes stored."""
    full = 1105
    return [
        (
            f"image tokens in the history after {r['turns']} turns",
            f"{r['mnemo_tokens']:,}",
            f"{r['baseline_tokens']:,} (every frame, full price)",
            _ratio(r["mnemo_tokens"], r["baseline_tokens"], pct=True),
        ),
        (
            "image tokens per compacted frame (placeholder)",
            f"{r['placeholder_tokens']:.1f} ({r['compacted']} frames)",
            f"{full} (1920×1080, high detail)",
            _ratio(r["placeholder_tokens"], full, pct=True),
        ),
        (
            "frames the model sees as pixels",
            f"{r['kept']} of {r['frames']}",
            f"{r['frames']}",
            _ratio(r["kept"], r["frames"], pct=True),
        ),
        (
            "bytes stored (both tiers)",
            f"{r['stored_bytes'] / 1e6:.1f} MB",
            f"{r['received_bytes'] / 1e6:.1f} MB received",
            _ratio(r["stored_bytes"], r["received_bytes"], pct=True),
        ),
    ]


def _dedup_rows(r: dict) -> list[TableRow]:
    """How many frames were deduplicated, and how many wrongly."""
    kinds = ", ".join(f"{k} {d}/{n}" for k, (d, n) in r["by_kind"].items())
    return [
        (
            "dedup rate (frames stored as 'screen unchanged')",
            f"{r['dups'] / r['frames']:.1%} (pHash ≤ 10 + grid ≤ 2)",
            f"{r['sha_dups'] / r['frames']:.1%} (identical bytes)",
            _ratio(r["dups"], r["sha_dups"]),
        ),
        ("unchanged screens deduplicated", f"{r['unchanged_dedup']} of {r['unchanged']}", "—", "—"),
        (
            "false duplicates among frames that truly changed",
            f"{r['false_dups'] / max(1, r['changed']):.1%} ({r['false_dups']} of {r['changed']}: {kinds})",
            f"{r['phash_only_false'] / max(1, r['changed']):.1%} (pHash ≤ 10 alone)",
            "—",
        ),
    ]


def _time_rows(r: dict) -> list[TableRow]:
    """What compaction, hashing, decoding, reading and appending cost."""
    drift = ", ".join(f"{k} {max(v)}" for k, v in r["drift"].items())
    return [
        (
            "compaction ms per turn (mean / p95)",
            f"{ms(r['compact'])} / {p95(r['compact']) * 1e3:.2f} ms",
            "—",
            "—",
        ),
        (
            "turn end ms incl. compaction + cold move (mean)",
            ms(r["end"]),
            f"{ms(r['plain_end'])} (turn without images)",
            _ratio(statistics.mean(r["end"]), statistics.mean(r["plain_end"])),
        ),
        (
            "hash ms per frame (pHash+dHash+aHash)",
            f"{ms(r['hash_reduced'])} (frame ÷8)",
            f"{ms(r['hash_full'])} (full frame)",
            _ratio(statistics.mean(r["hash_reduced"]), statistics.mean(r["hash_full"])),
        ),
        ("hash drift reduced vs full (max Hamming)", drift, "0", "—"),
        ("decode + validate ms per frame (Pillow)", ms(r["decode"]), "—", "—"),
        (
            "read ms per image incl. sha256 check",
            f"{ms(r['cold'])} (cold tier)",
            f"{ms(r['hot'])} (hot tier)",
            _ratio(statistics.mean(r["cold"]), statistics.mean(r["hot"])),
        ),
        ("append ms per step (call + screenshot)", ms(r["append"]), "—", "—"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="10 turns (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.turns = 10
    var_dir = Path(tempfile.mkdtemp(prefix="mnemo-bench-visual-"))
    try:
        setup_django(var_dir)
        result = run(args.turns, args.seed)
    finally:
        shutil.rmtree(var_dir, ignore_errors=True)
    print(header(args))
    print(
        f"# {result['frames']} frames ({result['distinct']} distinct screens, "
        f"{result['errors']} error dialogs); kept with pixels: each ended turn's first, last and error "
        "frames (and what a kept duplicate repeats)"
    )
    print(table(result))


if __name__ == "__main__":
    main()
