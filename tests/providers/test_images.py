"""Image token rules, checked against the worked examples of each provider's documentation."""

import pytest

from providers.images import (
    anthropic_size,
    anthropic_tokens,
    gemini_tokens,
    image_tokens,
    openai_high_detail_size,
    openai_patch_tokens,
)


@pytest.mark.parametrize(
    ("size", "detail", "tokens"),
    [
        # OpenAI's guide: 1024×1024 high → 768×768 → 4 tiles → 765; 2048×4096 high → 768×1536
        # → 6 tiles → 1105; any size at low detail → 85.
        ((1024, 1024), "high", 765),
        ((2048, 4096), "high", 1105),
        ((4096, 8192), "low", 85),
        # A 1920×1080 screenshot: shortest side to 768 → 1365×768 → 3×2 tiles.
        ((1920, 1080), "high", 85 + 170 * 6),
        ((1920, 1080), "auto", 85 + 170 * 6),
        # Small images are not enlarged: 300×200 is one tile.
        ((300, 200), "high", 255),
    ],
)
def test_openai_tiles(size, detail, tokens):
    assert image_tokens(width=size[0], height=size[1], model="gpt-4o", detail=detail) == tokens


def test_openai_resize_steps():
    assert openai_high_detail_size(2048, 4096) == (768, 1536)
    assert openai_high_detail_size(1920, 1080) == (1365, 768)
    assert openai_high_detail_size(500, 400) == (500, 400)


def test_openai_model_variants():
    assert image_tokens(width=1024, height=1024, model="gpt-4o-mini", detail="high") == 2833 + 5667 * 4
    assert image_tokens(width=1024, height=1024, model="o1", detail="high") == 75 + 150 * 4
    assert image_tokens(width=1024, height=1024, model="gpt-4o-2024-08-06", detail="low") == 85
    # Patch models: the guide's 1024×1024 → 32×32 patches = 1024, times the model's multiplier.
    assert openai_patch_tokens(1024, 1024, multiplier=1.0) == 1024
    assert image_tokens(width=1024, height=1024, model="gpt-4.1-mini") == 1659  # ceil(1024 × 1.62)
    # The guide's 1800×2400 example is capped at 1536 patches (before the multiplier).
    assert openai_patch_tokens(1800, 2400, multiplier=1.0) == 1452


def test_anthropic():
    # Anthropic's table: 1092×1092 (1.19 MP) ≈ 1590 tokens before the 1.15 MP cap; 200×200 ≈ 54.
    assert anthropic_tokens(200, 200) == 54
    assert anthropic_size(3000, 1000) == (1568, 522)
    w, h = anthropic_size(1920, 1080)
    assert w * h <= 1_150_000 and abs(w / h - 1920 / 1080) < 0.01
    assert image_tokens(width=1920, height=1080, model="claude-sonnet-4") == anthropic_tokens(1920, 1080)
    assert image_tokens(width=1920, height=1080, model="claude-sonnet-4") == 1532  # 1429×804


def test_gemini():
    assert gemini_tokens(384, 384) == 258
    assert gemini_tokens(385, 100) == 258
    assert gemini_tokens(1920, 1080) == 258 * 3 * 2
    assert image_tokens(width=1920, height=1080, model="gemini-2.0-flash") == 1548


def test_unknown_models_use_the_gpt4o_rule():
    assert image_tokens(width=1920, height=1080, model="qwen2.5-7b") == 1105
    assert image_tokens(width=1920, height=1080, model="mystery-model") == 1105


def test_bad_arguments():
    with pytest.raises(ValueError):
        image_tokens(width=0, height=10, model="gpt-4o")
    with pytest.raises(ValueError):
        image_tokens(width=10, height=10, model="gpt-4o", detail="ultra")
