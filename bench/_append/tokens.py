"""Token counting speed: count_message against raw tiktoken over the same corpus."""

from __future__ import annotations

import argparse
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from bench._append.text import token_corpus
from providers.model_table import model_info
from providers.tokens import count_message, get_encoding


@dataclass
class TokenRun:
    messages: int
    ours_seconds: float
    ours_tokens: int
    raw_seconds: float
    raw_tokens: int


def bench_tokens(args: argparse.Namespace, scratch: Path) -> TokenRun:
    # providers.tokens fills tiktoken's cache from the shipped vocabularies; point it at a temp dir rather
    # than the repository's var/.
    os.environ.pop("DJANGO_SETTINGS_MODULE", None)
    os.environ["MNEMO_VAR_DIR"] = str(scratch)

    model = "gpt-4o"
    encoding = get_encoding(model_info(model).encoding)
    corpus = token_corpus(random.Random(f"{args.seed}-tokens"), args.corpus)
    contents = [content for _, content in corpus]

    def ours() -> int:
        return sum(count_message(role=role, content=content, model=model) for role, content in corpus)

    def raw() -> int:
        return sum(len(encoding.encode_ordinary(content)) for content in contents)

    ours(), raw()  # warm-up: the first encodes build tiktoken's internal caches
    best_ours = best_raw = float("inf")
    ours_tokens = raw_tokens = 0
    # Interleaved rounds, best of each: both sides see the same noise from the machine.
    for _ in range(args.token_rounds):
        started = time.perf_counter()
        raw_tokens = raw()
        best_raw = min(best_raw, time.perf_counter() - started)
        started = time.perf_counter()
        ours_tokens = ours()
        best_ours = min(best_ours, time.perf_counter() - started)
    return TokenRun(len(corpus), best_ours, ours_tokens, best_raw, raw_tokens)
