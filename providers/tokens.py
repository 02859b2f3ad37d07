"""Token accounting: offline tiktoken encodings, and chat-message counts in OpenAI's format.

tiktoken downloads its vocabularies on first use; here its cache is filled from the copies shipped in
providers/data instead, so counting never needs the network.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import tiktoken

from providers.model_table import DEFAULT_MODEL_INFO, model_info, normalize_model_name

DATA_DIR = Path(__file__).resolve().parent / "data"
REPO_DIR = Path(__file__).resolve().parent.parent

# tiktoken names its cache file after the sha1 of the URL it would download from.
_BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"

# sha256 of the uncompressed vocabularies, as pinned in tiktoken_ext/openai_public.py: tiktoken discards
# (and re-downloads) a cached file with any other hash, so nothing else may be written to the cache.
SHIPPED_ENCODINGS: dict[str, str] = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}

# From OpenAI's cookbook "How to count tokens with tiktoken": each message is wrapped as
# <|start|>{role/name}\n{content}<|end|>\n, a name costs one more token, and every reply is primed with
# <|start|>assistant<|message|>. Non-OpenAI models are counted the same way, as an approximation.
MESSAGE_OVERHEAD_TOKENS = 3
NAME_OVERHEAD_TOKENS = 1
REPLY_PRIMING_TOKENS = 3
# gpt-3.5-turbo-0301 spent one more token per message and dropped the role when a name was given.
_LEGACY_0301_OVERHEADS = (4, -1)


def tiktoken_cache_path(cache_dir: Path, encoding: str) -> Path:
    """The file tiktoken reads ``encoding`` from when its cache is ``cache_dir``."""
    url = _BLOB_URL.format(name=encoding)
    return Path(cache_dir) / hashlib.sha1(url.encode(), usedforsecurity=False).hexdigest()


def _sha256_of_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:  # missing or unreadable: either way it has to be (re)written
        return None


def _shipped_vocabulary(encoding: str) -> bytes:
    source = DATA_DIR / f"{encoding}.tiktoken.gz"
    try:
        data = gzip.decompress(source.read_bytes())
    except (OSError, EOFError) as exc:
        raise RuntimeError(f"cannot read the shipped tiktoken vocabulary {source}: {exc}") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != SHIPPED_ENCODINGS[encoding]:
        raise RuntimeError(
            f"the shipped tiktoken vocabulary {source} is corrupt: sha256 {actual}, "
            f"expected {SHIPPED_ENCODINGS[encoding]}; restore it from the repository"
        )
    return data


def _write_atomically(target: Path, data: bytes) -> None:
    # Several workers may start at once: each writes its own temp file and renames it into place,
    # so a reader sees either no file or a complete one.
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f"{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def ensure_tiktoken_cache(cache_dir: Path) -> Path:
    """Fill tiktoken's cache in ``cache_dir`` from the shipped vocabularies and point tiktoken at it.

    Files already there with the right hash are left alone; missing or corrupt ones are replaced.
    Raises RuntimeError if the shipped data is corrupt or the directory is not writable.
    """
    cache_dir = Path(cache_dir)
    for encoding, expected in SHIPPED_ENCODINGS.items():
        target = tiktoken_cache_path(cache_dir, encoding)
        if _sha256_of_file(target) == expected:
            continue
        data = _shipped_vocabulary(encoding)
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            _write_atomically(target, data)
        except OSError as exc:
            raise RuntimeError(
                f"cannot write the tiktoken cache in {cache_dir}: {exc}; set TIKTOKEN_CACHE_DIR "
                "(Django setting) or MNEMO_VAR_DIR to a writable directory"
            ) from exc
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)
    return cache_dir


def _settings_cache_dir() -> Path | None:
    # providers is not a Django app, but runs inside one: honour the setting when there are settings.
    try:
        from django.conf import settings
    except ImportError:
        return None
    if not settings.configured and not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return None
    value = getattr(settings, "TIKTOKEN_CACHE_DIR", None)
    return Path(value) if value else None


def default_cache_dir() -> Path:
    """settings.TIKTOKEN_CACHE_DIR, else $MNEMO_VAR_DIR/tiktoken, else <repo>/var/tiktoken."""
    configured = _settings_cache_dir()
    if configured is not None:
        return configured
    var_dir = os.environ.get("MNEMO_VAR_DIR")
    if var_dir:
        return Path(var_dir) / "tiktoken"
    return REPO_DIR / "var" / "tiktoken"


_cache_lock = threading.Lock()
_cache_ready = False


def _ensure_cache_once() -> None:
    global _cache_ready
    if _cache_ready:
        return
    with _cache_lock:
        if not _cache_ready:
            ensure_tiktoken_cache(default_cache_dir())
            _cache_ready = True


@functools.cache
def get_encoding(name: str) -> tiktoken.Encoding:
    """A shipped tiktoken encoding, loaded offline; other encodings would need the network, so they fail."""
    if name not in SHIPPED_ENCODINGS:
        raise ValueError(f"unknown encoding {name!r}: Mnemo ships {', '.join(sorted(SHIPPED_ENCODINGS))}")
    _ensure_cache_once()
    return tiktoken.get_encoding(name)


def _encoder(model: str | None, encoding: str | None = None) -> tiktoken.Encoding:
    if encoding is not None:
        return get_encoding(encoding)
    info = model_info(model) if model else DEFAULT_MODEL_INFO
    return get_encoding(info.encoding)


# tiktoken's regex engine panics (a BaseException, not an Exception) on a whitespace run of several
# hundred thousand characters, so long texts are encoded in chunks well below that.
_CHUNK_CHARS = 100_000
# A space right after a non-space always starts a new pre-token in both encodings' split patterns, so
# cutting there leaves the count exact. Greedy ".*" finds the last such space, scanning back from the end.
_LAST_SAFE_CUT = re.compile(r".*\S ", re.DOTALL)


def _chunks(text: str) -> Iterator[str]:
    start = 0
    while len(text) - start > _CHUNK_CHARS:
        end = start + _CHUNK_CHARS
        match = _LAST_SAFE_CUT.match(text, start + _CHUNK_CHARS // 2, end)
        # No safe cut in the second half means a giant run of whitespace or of one word: cutting it
        # anywhere costs at most a token or two.
        cut = match.end() - 1 if match else end
        yield text[start:cut]
        start = cut
    yield text[start:]


def _count(encoder: tiktoken.Encoding, text: str) -> int:
    # encode_ordinary reads "<|endoftext|>" and friends in user text as plain text instead of raising
    # (same result as encode(disallowed_special=()), slightly faster).
    if not text:
        return 0
    if len(text) <= _CHUNK_CHARS:
        return len(encoder.encode_ordinary(text))
    return sum(len(encoder.encode_ordinary(chunk)) for chunk in _chunks(text))


def count_text(text: str, *, model: str | None = None, encoding: str | None = None) -> int:
    """Tokens in ``text`` under ``encoding``, else ``model``'s encoding, else the default model's."""
    return _count(_encoder(model, encoding), text)


def truncate_text(text: str, tokens: int, *, model: str | None = None) -> str:
    """The longest head of ``text`` of at most ``tokens`` tokens (cut on a token boundary)."""
    if tokens <= 0:
        return ""
    encoder = _encoder(model)
    # Tokens average well under 8 characters, so this head holds the cut; if it does not (a run of long
    # tokens), the head is returned whole: still within `tokens`, just shorter than it could be.
    head = text[: tokens * 8]
    ids = encoder.encode_ordinary(head)
    if len(ids) <= tokens and len(head) == len(text):
        return text
    return encoder.decode(ids[:tokens])


def message_overheads(model: str | None) -> tuple[int, int]:
    """(tokens added per message, tokens added per name) for ``model``."""
    if model and normalize_model_name(model).startswith("gpt-3.5-turbo-0301"):
        return _LEGACY_0301_OVERHEADS
    return MESSAGE_OVERHEAD_TOKENS, NAME_OVERHEAD_TOKENS


def _message_tokens(
    encoder: tiktoken.Encoding,
    overheads: tuple[int, int],
    *,
    role: str,
    texts: Iterable[str],
    name: str | None,
) -> int:
    per_message, per_name = overheads
    total = per_message + _count(encoder, role) + sum(_count(encoder, text) for text in texts)
    if name:
        total += _count(encoder, name) + per_name
    return total


def count_message(
    *,
    role: str,
    content: str,
    name: str | None = None,
    model: str | None = None,
    extra_text: str = "",
) -> int:
    """Tokens one chat message takes in a prompt, wrapping included.

    ``extra_text`` is for what the caller serialised besides the content, e.g. tool-call names and
    arguments. The reply priming is not included: see count_chat.
    """
    return _message_tokens(
        _encoder(model), message_overheads(model), role=role, texts=(content, extra_text), name=name
    )


def _content_texts(content: Any) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    # Multi-part content: only text parts are counted here; images are estimated elsewhere.
    return [
        part["text"]
        for part in content
        if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)
    ]


def _tool_call_texts(message: Mapping[str, Any]) -> list[str]:
    # The API's exact serialisation of tool calls is undocumented; their names and arguments are what
    # carries the tokens.
    calls = list(message.get("tool_calls") or [])
    if message.get("function_call"):
        calls.append({"function": message["function_call"]})
    texts: list[str] = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            texts.extend(
                value for value in (function.get("name"), function.get("arguments")) if isinstance(value, str)
            )
    return texts


def count_chat(messages: Iterable[Mapping[str, Any]], *, model: str | None = None) -> int:
    """Prompt tokens of a chat request: every message, wrapping included, plus the reply priming.

    Messages are OpenAI-style dicts: ``role``, ``content`` (a string, or a list of parts of which the
    ``{"type": "text"}`` ones count), optional ``name``, and ``tool_calls``/``function_call`` whose names
    and arguments count as message text.
    """
    encoder = _encoder(model)
    overheads = message_overheads(model)
    total = REPLY_PRIMING_TOKENS
    for message in messages:
        total += _message_tokens(
            encoder,
            overheads,
            role=message.get("role") or "",
            texts=[*_content_texts(message.get("content")), *_tool_call_texts(message)],
            name=message.get("name"),
        )
    return total
