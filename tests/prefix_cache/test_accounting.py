"""count_cached_parts: a text counted in parts cut before a space that follows a non-space is counted
exactly, in both encodings, whatever the parts hold."""

import random

import pytest

from prefix_cache.accounting import count_cached, count_cached_parts
from providers.tokens import count_text

# Texts a retrieved message may hold: words, digits, contractions, punctuation runs, newlines, other scripts,
# emoji, spaces of other kinds and special-token look-alikes.
PIECES = [
    "Priya", "said", "'s", "'ll", "42", "2023-05-07", "$1,299.00", "(ticket", "#12", "...", "—", "»",
    "\n", "\n\n", "\t", "\u00a0", "東京で", "привет", "😀", "e\u0301", "<|endoftext|>", "https://x.io/a?b=c",
    "ÅSA", "don't", "/", "]", ":", "  ", "“quoted”",
]  # fmt: skip


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) + rng.choice(["", " ", "", "\n"]) for _ in range(rng.randint(1, 12)))


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4"])  # o200k_base, cl100k_base
def test_a_label_and_texts_counted_in_parts_match_the_whole(model):
    rng = random.Random(11)
    for _ in range(400):
        speakers = [rng.choice(["Priya", "agent-3", "Mei Lin", "user"]) for _ in range(3)]
        texts = [random_text(rng).strip() for _ in range(3)]
        label = f"[#{rng.randint(1, 9999)} · 2023-05-0{rng.randint(1, 9)} · {speakers[0]}]"
        hit = [label, f" {texts[0]}"]
        group = [f"[#1–3 · 2023-05-01]\n{speakers[0]}:", f" {texts[0]}\n{speakers[1]}:", f" {texts[1]}"]
        for parts in (hit, group):
            assert count_cached_parts(parts, model=model) == count_text("".join(parts), model=model), parts


def test_counts_are_cached_by_content():
    text = "The staging ledger listens on port 23456 (cached)."
    assert count_cached(text, model="gpt-4o") == count_text(text, model="gpt-4o")
    assert count_cached(text, model="gpt-4o") == count_text(text, model="gpt-4o")
    assert count_cached("", model="gpt-4o") == 0
