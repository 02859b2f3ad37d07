"""Token counting, the model table, and loading tiktoken's vocabularies with no network."""

from __future__ import annotations

import gzip
import hashlib
import inspect
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import tiktoken
import tiktoken.load
import tiktoken.registry
import tiktoken_ext.openai_public

from providers import tokens
from providers.model_table import DEFAULT_MODEL_INFO, MODELS, is_known_model, model_info
from providers.tokens import (
    MESSAGE_OVERHEAD_TOKENS,
    REPLY_PRIMING_TOKENS,
    count_chat,
    count_message,
    count_text,
    ensure_tiktoken_cache,
    get_encoding,
    tiktoken_cache_path,
)

# The example conversation from OpenAI's cookbook "How to count tokens with tiktoken", whose prompt token
# counts the cookbook checked against the API: 129 for gpt-3.5-turbo and gpt-4, 124 for gpt-4o and
# gpt-4o-mini, 127 for gpt-3.5-turbo-0301.
COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon "
        "into plain English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities for "
        "increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]


@pytest.fixture
def isolated_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget loaded encodings and make any download attempt fail loudly; restore both afterwards."""

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setattr(requests, "get", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    # Recorded so that the value ensure_tiktoken_cache() sets is undone after the test.
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- count_text ---------------------------------------------------------------------------------


def test_hello_world_is_two_tokens_in_both_encodings() -> None:
    assert count_text("hello world", model="gpt-4o") == 2
    assert count_text("hello world", model="gpt-4") == 2
    assert count_text("hello world") == 2
    assert count_text("") == 0


@pytest.mark.parametrize(
    ("text", "cl100k", "o200k"),
    [
        ("お誕生日おめでとう", 9, 8),
        ("Привет, как дела?", 8, 6),
    ],
)
def test_encodings_differ_and_models_pick_theirs(text: str, cl100k: int, o200k: int) -> None:
    assert count_text(text, encoding="cl100k_base") == cl100k
    assert count_text(text, encoding="o200k_base") == o200k
    assert count_text(text, model="gpt-4") == cl100k
    assert count_text(text, model="gpt-3.5-turbo") == cl100k
    assert count_text(text, model="claude-3-5-sonnet") == cl100k
    assert count_text(text, model="gpt-4o") == o200k
    assert count_text(text, model="gemini-2.5-pro") == o200k
    assert count_text(text, model="some-unknown-model") == o200k
    assert count_text(text) == o200k
    # An explicit encoding wins over the model's.
    assert count_text(text, model="gpt-4", encoding="o200k_base") == o200k


@pytest.mark.parametrize("text", ["<|endoftext|>", "<|fim_prefix|>x<|fim_suffix|>", "<|endofprompt|>"])
def test_special_tokens_in_text_are_counted_as_text(text: str) -> None:
    for encoding in ("cl100k_base", "o200k_base"):
        expected = len(get_encoding(encoding).encode(text, disallowed_special=()))
        assert count_text(text, encoding=encoding) == expected
        assert expected > 1  # spelled out, not the single special token
    assert count_text("<|endoftext|>", model="gpt-4o") == 7
    assert count_text("<|endoftext|>", model="gpt-4") == 7


def test_unknown_encoding_is_refused_rather_than_downloaded() -> None:
    with pytest.raises(ValueError, match="r50k_base"):
        count_text("hello", encoding="r50k_base")


def test_long_text_is_counted_exactly_across_chunks() -> None:
    pieces = ["hello", "World", "naïve", "東京", "don't", "123456", "...", "\n\n", "(x)", "  ", "\t", "😀"]
    text = " ".join(pieces[i % len(pieces)] + ("\n" if i % 7 == 0 else "") for i in range(100_000))
    assert len(text) > 3 * tokens._CHUNK_CHARS
    for encoding in ("cl100k_base", "o200k_base"):
        assert count_text(text, encoding=encoding) == len(get_encoding(encoding).encode_ordinary(text))


def test_huge_whitespace_run_does_not_crash() -> None:
    # Encoded in one go, this makes tiktoken's regex engine panic under o200k_base.
    run = "\u00a0" * 1_000_000
    assert count_text(run, encoding="o200k_base") > 0
    # Where tiktoken can encode it whole, chunking costs at most a token per chunk.
    spaces = " " * 300_000
    whole = len(get_encoding("cl100k_base").encode_ordinary(spaces))
    assert abs(count_text(spaces, encoding="cl100k_base") - whole) <= len(spaces) // tokens._CHUNK_CHARS


def test_counting_from_many_threads_agrees() -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 50
    expected = count_text(text, model="gpt-4o")
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda _: count_text(text, model="gpt-4o"), range(64)))
    assert results == [expected] * 64


# --- count_message / count_chat -----------------------------------------------------------------


def test_constants() -> None:
    assert REPLY_PRIMING_TOKENS == 3
    assert MESSAGE_OVERHEAD_TOKENS == 3


def test_count_message_overheads() -> None:
    # 3 per message + "user" (1) + "hello world" (2)
    assert count_message(role="user", content="hello world", model="gpt-4o") == 6
    # + "alice" (1) + 1 per name
    assert count_message(role="user", content="hello world", name="alice", model="gpt-4o") == 8
    # gpt-3.5-turbo-0301: 4 per message, and a name replaces the role (-1)
    assert count_message(role="user", content="hello world", model="gpt-3.5-turbo-0301") == 7
    assert count_message(role="user", content="hello world", name="alice", model="gpt-3.5-turbo-0301") == 7
    extra = '{"city": "Paris"}'
    expected = MESSAGE_OVERHEAD_TOKENS + sum(count_text(t, model="gpt-4o") for t in ("assistant", extra))
    assert count_message(role="assistant", content="", extra_text=extra, model="gpt-4o") == expected


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-3.5-turbo", 129),
        ("gpt-4-0613", 129),
        ("gpt-4", 129),
        ("gpt-4o", 124),
        ("gpt-4o-mini", 124),
        ("gpt-4o-2024-08-06", 124),
        ("openai/gpt-4o", 124),
        ("gpt-3.5-turbo-0301", 127),
    ],
)
def test_count_chat_matches_the_cookbook(model: str, expected: int) -> None:
    assert count_chat(COOKBOOK_MESSAGES, model=model) == expected


def test_count_chat_is_messages_plus_reply_priming() -> None:
    per_message = sum(
        count_message(role=m["role"], content=m["content"], name=m.get("name"), model="gpt-4")
        for m in COOKBOOK_MESSAGES
    )
    assert count_chat(COOKBOOK_MESSAGES, model="gpt-4") == per_message + REPLY_PRIMING_TOKENS
    assert count_chat([], model="gpt-4o") == REPLY_PRIMING_TOKENS


def test_count_chat_counts_text_parts_only() -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "hello world"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "hello world"},
        ],
    }
    # 3 reply priming + 3 per message + "user" (1) + 2 x "hello world" (2)
    assert count_chat([message], model="gpt-4o") == 11


def test_count_chat_counts_tool_call_names_and_arguments() -> None:
    arguments = '{"location": "Paris, France", "unit": "celsius"}'
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        ],
    }
    expected = (
        REPLY_PRIMING_TOKENS
        + MESSAGE_OVERHEAD_TOKENS
        + count_text("assistant", model="gpt-4o")
        + count_text("get_weather", model="gpt-4o")
        + count_text(arguments, model="gpt-4o")
    )
    assert count_chat([message], model="gpt-4o") == expected
    legacy = {"role": "assistant", "content": None, "function_call": message["tool_calls"][0]["function"]}
    assert count_chat([legacy], model="gpt-4o") == expected


# --- model table ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "resolved", "window", "encoding"),
    [
        ("gpt-4o", "gpt-4o", 128_000, "o200k_base"),
        ("gpt-4o-2024-08-06", "gpt-4o", 128_000, "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini", 128_000, "o200k_base"),
        ("openai/gpt-4o", "gpt-4o", 128_000, "o200k_base"),
        ("ft:gpt-4o-mini:acme::abc123", "gpt-4o-mini", 128_000, "o200k_base"),
        ("gpt-4.1-mini-2025-04-14", "gpt-4.1-mini", 1_047_576, "o200k_base"),
        ("o1", "o1", 200_000, "o200k_base"),
        ("o3-mini-2025-01-31", "o3-mini", 200_000, "o200k_base"),
        ("gpt-4-0613", "gpt-4", 8_192, "cl100k_base"),
        ("gpt-4-32k-0613", "gpt-4-32k", 32_768, "cl100k_base"),
        ("gpt-4-turbo-2024-04-09", "gpt-4-turbo", 128_000, "cl100k_base"),
        ("gpt-4-1106-preview", "gpt-4-1106-preview", 128_000, "cl100k_base"),
        ("gpt-3.5-turbo-0301", "gpt-3.5-turbo", 16_385, "cl100k_base"),
        ("claude-3-5-sonnet-20241022", "claude-3-5-sonnet", 200_000, "cl100k_base"),
        ("anthropic/claude-3.5-sonnet", "claude-3-5-sonnet", 200_000, "cl100k_base"),
        ("claude-sonnet-4-20250514", "claude-sonnet-4", 200_000, "cl100k_base"),
        ("claude-3-opus-latest", "claude-3-opus", 200_000, "cl100k_base"),
        ("gemini-1.5-pro-002", "gemini-1.5-pro", 2_097_152, "o200k_base"),
        ("google/gemini-2.5-flash", "gemini-2.5-flash", 1_048_576, "o200k_base"),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b", 131_072, "o200k_base"),
        ("qwen2.5-7b-instruct", "qwen2.5-7b", 131_072, "o200k_base"),
        ("qwen2.5:3b", "qwen2.5-3b", 32_768, "o200k_base"),
        ("qwen-max-latest", "qwen-max", 32_768, "o200k_base"),
    ],
)
def test_model_names_resolve(name: str, resolved: str, window: int, encoding: str) -> None:
    info = model_info(name)
    assert (info.name, info.context_window, info.encoding) == (resolved, window, encoding)
    assert is_known_model(name)


@pytest.mark.parametrize("name", ["llama3", "mistral-large", "o10", "gpt-4.5-preview", "", "gpt"])
def test_unknown_models_get_the_default(name: str) -> None:
    assert model_info(name) is DEFAULT_MODEL_INFO
    assert not is_known_model(name)


def test_default_model_info() -> None:
    assert DEFAULT_MODEL_INFO.name == "default"
    assert DEFAULT_MODEL_INFO.encoding == "o200k_base"
    assert DEFAULT_MODEL_INFO.context_window == 128_000


def test_only_openai_counts_are_exact() -> None:
    assert model_info("gpt-4o").exact_tokens
    assert model_info("claude-3-7-sonnet").provider == "anthropic"
    assert not model_info("claude-3-7-sonnet").exact_tokens
    assert not model_info("qwen-plus").exact_tokens


def test_table_is_consistent() -> None:
    required = {
        "gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "o1", "o1-mini", "o3",
        "o3-mini", "o4-mini", "gpt-4-turbo", "gpt-4", "gpt-4-32k", "gpt-3.5-turbo",
        "claude-3-5-sonnet", "claude-3-5-haiku", "claude-3-7-sonnet", "claude-sonnet-4", "claude-opus-4",
        "claude-3-opus", "claude-3-haiku", "gemini-1.5-pro", "gemini-1.5-flash", "gemini-2.0-flash",
        "gemini-2.5-pro", "gemini-2.5-flash", "qwen-max", "qwen-plus", "qwen-turbo",
    }  # fmt: skip
    assert required <= set(MODELS)
    for name, info in MODELS.items():
        assert info.name == name == name.lower()
        assert info.encoding in tokens.SHIPPED_ENCODINGS
        assert 0 < info.max_output_tokens <= info.context_window
        assert info.exact_tokens == (info.provider == "openai")
        if info.provider == "anthropic":
            assert (info.context_window, info.encoding) == (200_000, "cl100k_base")


# --- offline vocabularies -------------------------------------------------------------------------


def test_shipped_urls_and_hashes_match_tiktoken() -> None:
    source = inspect.getsource(tiktoken_ext.openai_public)
    for name, sha256 in tokens.SHIPPED_ENCODINGS.items():
        assert tokens._BLOB_URL.format(name=name) in source
        assert sha256 in source
        shipped = tokens.DATA_DIR / f"{name}.tiktoken.gz"
        assert hashlib.sha256(gzip.decompress(shipped.read_bytes())).hexdigest() == sha256


def test_encodings_load_without_network(tmp_path: Path, isolated_tiktoken: None) -> None:
    cache = ensure_tiktoken_cache(tmp_path / "cache")
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(cache)
    assert tiktoken.get_encoding("cl100k_base").encode_ordinary("hello world") == [15339, 1917]
    assert tiktoken.get_encoding("o200k_base").encode_ordinary("hello world") == [24912, 2375]


def test_without_the_cache_tiktoken_would_download(tmp_path: Path, isolated_tiktoken: None) -> None:
    # The control for the test above: an empty cache really does send tiktoken to the network.
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tmp_path)
    with pytest.raises(AssertionError, match="network access attempted"):
        tiktoken.get_encoding("o200k_base")


def test_corrupted_cache_file_is_replaced(tmp_path: Path, isolated_tiktoken: None) -> None:
    ensure_tiktoken_cache(tmp_path)
    corrupt = tiktoken_cache_path(tmp_path, "o200k_base")
    corrupt.write_bytes(b"not a vocabulary")
    intact = tiktoken_cache_path(tmp_path, "cl100k_base")
    intact_stat = intact.stat()

    ensure_tiktoken_cache(tmp_path)

    assert _sha256(corrupt) == tokens.SHIPPED_ENCODINGS["o200k_base"]
    assert intact.stat().st_ino == intact_stat.st_ino  # a good file is left alone
    assert intact.stat().st_mtime_ns == intact_stat.st_mtime_ns
    assert tiktoken.get_encoding("o200k_base").encode_ordinary("hello world") == [24912, 2375]


def test_corrupt_shipped_data_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_tiktoken: None
) -> None:
    monkeypatch.setitem(tokens.SHIPPED_ENCODINGS, "cl100k_base", "0" * 64)
    with pytest.raises(RuntimeError, match="corrupt"):
        ensure_tiktoken_cache(tmp_path)
    assert not tiktoken_cache_path(tmp_path, "cl100k_base").exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_concurrent_fills_leave_complete_files(tmp_path: Path, isolated_tiktoken: None) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda _: ensure_tiktoken_cache(tmp_path), range(8)))
    for name, sha256 in tokens.SHIPPED_ENCODINGS.items():
        assert _sha256(tiktoken_cache_path(tmp_path, name)) == sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        tiktoken_cache_path(tmp_path, name).name for name in tokens.SHIPPED_ENCODINGS
    )


def test_unwritable_cache_dir_is_a_clear_error(tmp_path: Path, isolated_tiktoken: None) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RuntimeError, match="cannot write the tiktoken cache"):
        ensure_tiktoken_cache(blocker / "cache")


# --- where the cache lives ------------------------------------------------------------------------


def test_cache_dir_from_mnemo_var_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_settings_cache_dir", lambda: None)
    monkeypatch.setenv("MNEMO_VAR_DIR", str(tmp_path))
    assert tokens.default_cache_dir() == tmp_path / "tiktoken"
    monkeypatch.delenv("MNEMO_VAR_DIR")
    assert tokens.default_cache_dir() == Path(tokens.__file__).resolve().parent.parent / "var" / "tiktoken"


def test_cache_dir_from_django_settings(tmp_path: Path) -> None:
    from django.conf import settings
    from django.test import override_settings

    if not settings.configured:
        pytest.skip("Django settings are not configured in this run")
    with override_settings(TIKTOKEN_CACHE_DIR=str(tmp_path)):
        assert tokens.default_cache_dir() == tmp_path
