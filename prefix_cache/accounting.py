"""Token counts of the slow-changing composite texts (the system message and its prefixes), memoised by
content hash so a request re-uses the count of a system message it has seen before instead of
re-tokenising it."""

import hashlib
import threading
from collections import OrderedDict

from providers.model_table import model_info
from providers.tokens import count_text

_MAX_ENTRIES = 4096
_cache: OrderedDict[tuple[str, bytes], int] = OrderedDict()
_lock = threading.Lock()


def count_cached(text: str, *, model: str) -> int:
    if not text:
        return 0
    encoding = model_info(model).encoding
    key = (encoding, hashlib.blake2b(text.encode(), digest_size=16).digest())
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
