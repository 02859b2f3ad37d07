"""Image token estimates by each provider's published rule, so screenshots are budgeted like text.

- OpenAI tile models (gpt-4o, gpt-4.1, o1, o3, …): at high detail the image is scaled to fit 2048×2048, then
  so that its shortest side is 768 px (never up), and costs base + per-tile × the 512-px tiles covering it;
  low detail costs the base alone. ``auto`` is counted as high: the model picks high for anything larger
  than a thumbnail, and a screenshot always is.
- OpenAI patch models (gpt-4.1-mini/nano, o4-mini): 32-px patches, at most 1536, times a model multiplier.
- Anthropic: width × height / 750 after scaling to fit a 1568-px long edge and 1.15 megapixels.
- Gemini: 258 tokens for an image with both sides ≤ 384 px, else 258 per 768×768 tile.

Everything else (Qwen, unknown models) is counted with the gpt-4o rule, the most common one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from providers.model_table import model_info, normalize_model_name

DETAILS = ("auto", "low", "high")


@dataclass(frozen=True, slots=True)
class _Tiles:
    base: int
    per_tile: int


@dataclass(frozen=True, slots=True)
class _Patches:
    multiplier: float


# Longest prefix wins (see _openai_rule); from OpenAI's "Images and vision" guide.
_OPENAI_RULES: dict[str, _Tiles | _Patches] = {
    "gpt-4o": _Tiles(85, 170),
    "chatgpt-4o": _Tiles(85, 170),
    "gpt-4.1": _Tiles(85, 170),
    "gpt-4.5": _Tiles(85, 170),
    # gpt-4o-mini bills images at about the price of gpt-4o, so at 33× the tokens.
    "gpt-4o-mini": _Tiles(2833, 5667),
    "o1": _Tiles(75, 150),
    "o3": _Tiles(75, 150),
    "computer-use-preview": _Tiles(65, 129),
    "gpt-4.1-mini": _Patches(1.62),
    "gpt-4.1-nano": _Patches(2.46),
    "o4-mini": _Patches(1.72),
}
_DEFAULT_OPENAI_RULE = _Tiles(85, 170)
_MAX_PATCHES = 1536

ANTHROPIC_MAX_EDGE = 1568
ANTHROPIC_MAX_PIXELS = 1_150_000
GEMINI_SMALL_EDGE = 384
GEMINI_TILE = 768
GEMINI_TOKENS_PER_TILE = 258


def _openai_rule(model: str) -> _Tiles | _Patches:
    key = normalize_model_name(model)
    best = ""
    for prefix in _OPENAI_RULES:
        if (key == prefix or key.startswith(prefix + "-")) and len(prefix) > len(best):
            best = prefix
    return _OPENAI_RULES[best] if best else _DEFAULT_OPENAI_RULE


def openai_high_detail_size(width: int, height: int) -> tuple[int, int]:
    """The size OpenAI tiles at high detail: fit 2048×2048, then shortest side 768 (never enlarged)."""
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    return max(1, math.floor(w)), max(1, math.floor(h))


def openai_tile_tokens(
    width: int, height: int, *, detail: str = "auto", base: int = 85, per_tile: int = 170
) -> int:
    if detail == "low":
        return base
    w, h = openai_high_detail_size(width, height)
    tiles = math.ceil(w / 512) * math.ceil(h / 512)
    return base + per_tile * tiles


def openai_patch_tokens(width: int, height: int, *, multiplier: float) -> int:
    patches = math.ceil(width / 32) * math.ceil(height / 32)
    if patches > _MAX_PATCHES:
        ratio = math.sqrt(32 * 32 * _MAX_PATCHES / (width * height))
        ratio *= min(
            math.floor(width * ratio / 32) / (width * ratio / 32),
            math.floor(height * ratio / 32) / (height * ratio / 32),
        )
        patches = min(_MAX_PATCHES, math.ceil(width * ratio / 32) * math.ceil(height * ratio / 32))
    return math.ceil(patches * multiplier)


def anthropic_size(width: int, height: int) -> tuple[int, int]:
    scale = min(
        1.0, ANTHROPIC_MAX_EDGE / max(width, height), math.sqrt(ANTHROPIC_MAX_PIXELS / (width * height))
    )
    # The epsilon keeps 3000 × (1568 / 3000) at 1568 instead of 1567.999….
    return max(1, math.floor(width * scale + 1e-9)), max(1, math.floor(height * scale + 1e-9))


def anthropic_tokens(width: int, height: int) -> int:
    w, h = anthropic_size(width, height)
    return math.ceil(w * h / 750)


def gemini_tokens(width: int, height: int) -> int:
    if width <= GEMINI_SMALL_EDGE and height <= GEMINI_SMALL_EDGE:
        return GEMINI_TOKENS_PER_TILE
    return GEMINI_TOKENS_PER_TILE * math.ceil(width / GEMINI_TILE) * math.ceil(height / GEMINI_TILE)


def image_tokens(*, width: int, height: int, model: str, detail: str = "auto") -> int:
    """Tokens one image of this size costs in a prompt to ``model`` (see the module docstring)."""
    if width <= 0 or height <= 0:
        raise ValueError("an image has a positive width and height")
    if detail not in DETAILS:
        raise ValueError(f"detail must be one of {', '.join(DETAILS)}")
    provider = model_info(model).provider
    if provider == "anthropic":
        return anthropic_tokens(width, height)
    if provider == "google":
        return gemini_tokens(width, height)
    rule = _openai_rule(model) if provider == "openai" else _DEFAULT_OPENAI_RULE
    if isinstance(rule, _Patches):
        # Patch models have no low-detail discount in the guide; they read every patch.
        return openai_patch_tokens(width, height, multiplier=rule.multiplier)
    return openai_tile_tokens(width, height, detail=detail, base=rule.base, per_tile=rule.per_tile)
