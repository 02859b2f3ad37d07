"""API keys never reach a log line Mnemo controls: a filter that masks them in the message and its arguments.

Browsers cannot set headers on a WebSocket, so a socket may carry its key as `?api_key=` (or as the
`mnemo.bearer.<key>` subprotocol), and servers log the path with its query. The filter sits on Mnemo's own
log handler (LOGGING) and on the servers' loggers when an entry point loads (uvicorn, granian); a server
that writes its access log some other way should have it turned off (docs/operations.md, Deploying)."""

import logging
import re
from typing import Any

_PATTERNS = [
    # ?api_key=… / &api_key=… in a logged URL (raw or percent-encoded as it came).
    (re.compile(r"((?:^|[?&;\s])api_key=)[^&;\s\"']*", re.IGNORECASE), r"\1[redacted]"),
    # The WebSocket subprotocol token.
    (re.compile(r"(mnemo\.bearer\.)[A-Za-z0-9_\-.~%]+"), r"\1[redacted]"),
    # A key anywhere else (a header, an error): keep its lookup prefix, which names the key but opens nothing.
    (re.compile(r"\b(mnemo_[a-z0-9]{8}_)[A-Za-z0-9_\-]+"), r"\1[redacted]"),
]

# The loggers servers write request lines to (uvicorn's WebSocket lines go to uvicorn.error).
SERVER_LOGGERS = ("uvicorn.access", "uvicorn.error", "granian.access", "daphne.access", "daphne.server")


def redact(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _redact_arg(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


class RedactSecrets(logging.Filter):
    """Masks keys in place and keeps the record's shape: uvicorn's access formatter unpacks `args` as a
    tuple, so the arguments are redacted one by one rather than merged into the message."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _redact_arg(v) for k, v in record.args.items()}
        return True


def redact_server_logs() -> None:
    """Put the filter on the servers' loggers (idempotent). A logger's own filter sees only the records
    logged on it, which is where the servers write their request lines."""
    for name in SERVER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())
