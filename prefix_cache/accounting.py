"""Token counts of texts that recur from call to call (the system message and its prefixes, the messages
retrieval quotes), memoised so a request re-uses a count instead of re-tokenising."""

import threading
from collections import OrderedDict

from providers.model_table import model_info
from providers.tokens import count_text

# Room for every message a busy process's retrieval quotes, not only the system messages.
_MAX_ENTRIES = 32768
# By the text's hash and length, not by the text (as providers.dates.mentions): the cache must not keep every
# quoted message alive, and a context call looks up hundreds of retrieved texts, whose str hash is one pass
# in C where a digest of their encoded bytes cost more than the rest of the lookup.
_cache: OrderedDict[tuple[str, int, int], int] = OrderedDict()
_lock = threading.Lock()


def count_cached(text: str, *, model: str) -> int:
    return _count(text, model_info(model).encoding)


def count_cached_parts(parts: list[str], *, model: str) -> int:
    """Tokens of "".join(parts), each part counted (and cached) on its own: every part after the first must
    start with a space that follows a non-space character, where a new pre-token always starts in both
    encodings (providers.tokens), so the sum is the exact count. A retrieved message's label changes with
    the call; its text, counted apart, is counted once."""
    encoding = model_info(model).encoding
    return sum([_count(part, encoding) for part in parts])


def _count(text: str, encoding: str) -> int:
    if not text:
        return 0
    key = (encoding, hash(text), len(text))
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    tokens = count_text(text, encoding=encoding)
    with _lock:
        _cache[key] = tokens
        if len(_cache) > _MAX_ENTRIES:
            _cache.popitem(last=False)
    return tokens
