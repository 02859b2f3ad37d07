"""The generated computer-use session: UI-like screenshots drawn with Pillow, and how the screen changes from
step to step (the generator knows which frames truly differ)."""

from __future__ import annotations

import io
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

W, H = 1920, 1080
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
