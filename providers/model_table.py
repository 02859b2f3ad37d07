"""Known chat models: which tiktoken encoding counts their tokens, and their published context limits.

Only OpenAI's counts are exact. Anthropic's, Google's and Alibaba's tokenizers are not shipped with tiktoken
(Anthropic's is not public at all), so their models are counted with the closest tiktoken encoding as a
documented approximation (``exact_tokens=False``):

- Claude: ``cl100k_base``. Claude tokenizes English a little less densely than cl100k, so budgets computed
  this way can undercount by some percent; keep a safety margin when filling a Claude window to the brim.
- Gemini and Qwen: ``o200k_base``, the closest large multilingual BPE vocabulary available offline.

``context_window`` is the published maximum a request may use. For OpenAI and Anthropic it holds prompt
and reply together; for Gemini it is the input limit. ``max_output_tokens`` is the published reply ceiling.
A caller budgeting a prompt should reserve its reply budget out of ``context_window``.

Names resolve by exact match, then by the longest known prefix that ends on a separator (so dated
snapshots such as ``gpt-4o-2024-08-06`` or ``claude-3-5-sonnet-20241022`` find their family), after
dropping any ``vendor/`` path (``openai/gpt-4o``, ``Qwen/Qwen2.5-72B-Instruct``) and lower-casing.
Anything else gets ``DEFAULT_MODEL_INFO``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

Provider = Literal["openai", "anthropic", "google", "qwen", "unknown"]
EncodingName = Literal["o200k_base", "cl100k_base"]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    provider: Provider
    encoding: EncodingName
    context_window: int
    max_output_tokens: int
    # False where the encoding only approximates the model's real tokenizer (see module docstring).
    exact_tokens: bool = True


def _openai(name: str, encoding: EncodingName, context_window: int, max_output_tokens: int) -> ModelInfo:
    return ModelInfo(name, "openai", encoding, context_window, max_output_tokens)


def _claude(name: str, max_output_tokens: int) -> ModelInfo:
    return ModelInfo(name, "anthropic", "cl100k_base", 200_000, max_output_tokens, exact_tokens=False)


def _gemini(name: str, context_window: int, max_output_tokens: int) -> ModelInfo:
    return ModelInfo(name, "google", "o200k_base", context_window, max_output_tokens, exact_tokens=False)


def _qwen(name: str, context_window: int, max_output_tokens: int) -> ModelInfo:
    return ModelInfo(name, "qwen", "o200k_base", context_window, max_output_tokens, exact_tokens=False)


_MODELS: tuple[ModelInfo, ...] = (
    # OpenAI, from the model pages on platform.openai.com.
    _openai("gpt-4o", "o200k_base", 128_000, 16_384),
    _openai("chatgpt-4o-latest", "o200k_base", 128_000, 16_384),
    _openai("gpt-4o-mini", "o200k_base", 128_000, 16_384),
    _openai("gpt-4.1", "o200k_base", 1_047_576, 32_768),
    _openai("gpt-4.1-mini", "o200k_base", 1_047_576, 32_768),
    _openai("gpt-4.1-nano", "o200k_base", 1_047_576, 32_768),
    _openai("o1", "o200k_base", 200_000, 100_000),
    _openai("o1-preview", "o200k_base", 128_000, 32_768),
    _openai("o1-mini", "o200k_base", 128_000, 65_536),
    _openai("o3", "o200k_base", 200_000, 100_000),
    _openai("o3-mini", "o200k_base", 200_000, 100_000),
    _openai("o4-mini", "o200k_base", 200_000, 100_000),
    _openai("gpt-4-turbo", "cl100k_base", 128_000, 4_096),
    # The GPT-4 Turbo previews are dated like gpt-4 snapshots but have the Turbo window.
    _openai("gpt-4-1106-preview", "cl100k_base", 128_000, 4_096),
    _openai("gpt-4-0125-preview", "cl100k_base", 128_000, 4_096),
    # The original GPT-4 models have no separate reply ceiling: the reply may use what the prompt leaves.
    _openai("gpt-4", "cl100k_base", 8_192, 8_192),
    _openai("gpt-4-32k", "cl100k_base", 32_768, 32_768),
    _openai("gpt-3.5-turbo", "cl100k_base", 16_385, 4_096),
    # Anthropic: every Claude 3+ model has a 200k window; reply ceilings from docs.anthropic.com.
    _claude("claude-3-5-sonnet", 8_192),
    _claude("claude-3-5-haiku", 8_192),
    _claude("claude-3-7-sonnet", 64_000),
    _claude("claude-sonnet-4", 64_000),
    _claude("claude-opus-4", 32_000),
    _claude("claude-3-opus", 4_096),
    _claude("claude-3-sonnet", 4_096),
    _claude("claude-3-haiku", 4_096),
    # A Claude not listed above is still a 200k-window Claude; the smallest reply ceiling is the safe guess.
    _claude("claude", 4_096),
    # Google: input token limits from ai.google.dev.
    _gemini("gemini-1.5-pro", 2_097_152, 8_192),
    _gemini("gemini-1.5-flash", 1_048_576, 8_192),
    _gemini("gemini-2.0-flash", 1_048_576, 8_192),
    _gemini("gemini-2.5-pro", 1_048_576, 65_536),
    _gemini("gemini-2.5-flash", 1_048_576, 65_536),
    # Qwen2.5 open weights (model cards): 7B and up reach 128k (131,072) with YaRN, the small ones 32k.
    _qwen("qwen2.5-0.5b", 32_768, 8_192),
    _qwen("qwen2.5-1.5b", 32_768, 8_192),
    _qwen("qwen2.5-3b", 32_768, 8_192),
    _qwen("qwen2.5-7b", 131_072, 8_192),
    _qwen("qwen2.5-14b", 131_072, 8_192),
    _qwen("qwen2.5-32b", 131_072, 8_192),
    _qwen("qwen2.5-72b", 131_072, 8_192),
    # "qwen2.5" without a size (e.g. Ollama's default tag): the smaller window, so a budget never overruns.
    _qwen("qwen2.5", 32_768, 8_192),
    # Qwen API models (Alibaba Cloud Model Studio, stable aliases).
    _qwen("qwen-max", 32_768, 8_192),
    _qwen("qwen-plus", 131_072, 8_192),
    _qwen("qwen-turbo", 1_000_000, 8_192),
)

MODELS: dict[str, ModelInfo] = {info.name: info for info in _MODELS}

# Used for any model the table does not know: the modern OpenAI encoding and the most common window.
DEFAULT_MODEL_INFO = ModelInfo(
    name="default",
    provider="unknown",
    encoding="o200k_base",
    context_window=128_000,
    max_output_tokens=4_096,
    exact_tokens=False,
)

# A prefix only counts when the name continues with one of these, so "o1" does not claim "o10"
# and "gpt-4" does not claim "gpt-4.5". ":" never reaches here: it is normalized to "-".
_SEPARATORS = ("-", "@", "_")

# Longest first, so the first hit is the longest prefix.
_BY_LENGTH: tuple[str, ...] = tuple(sorted(MODELS, key=len, reverse=True))


def normalize_model_name(name: str) -> str:
    """The form the table is keyed by: lower case, no vendor path, ":" as "-"."""
    key = name.strip().lower()
    # Gateways and Hugging Face put a vendor path in front ("openai/gpt-4o", "Qwen/Qwen2.5-7B-Instruct").
    key = key.rsplit("/", 1)[-1]
    # Ollama tags ("qwen2.5:7b") and fine-tune ids ("ft:gpt-4o-mini:org::id") use ":".
    key = key.removeprefix("ft:").replace(":", "-")
    # OpenRouter spells Claude versions with dots ("claude-3.5-sonnet"); Anthropic uses dashes.
    if key.startswith("claude"):
        key = key.replace(".", "-")
    return key


def _lookup(name: str) -> ModelInfo | None:
    key = normalize_model_name(name)
    if key in MODELS:
        return MODELS[key]
    for known in _BY_LENGTH:
        if key.startswith(known) and key[len(known)] in _SEPARATORS:
            return MODELS[known]
    return None


@functools.lru_cache(maxsize=1024)
def model_info(name: str) -> ModelInfo:
    """The table entry for ``name`` (exact, then longest prefix), else ``DEFAULT_MODEL_INFO``."""
    return _lookup(name) or DEFAULT_MODEL_INFO


def is_known_model(name: str) -> bool:
    return _lookup(name) is not None
