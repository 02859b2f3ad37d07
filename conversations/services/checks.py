"""What a message may hold, checked the same way on append, edit and transcript import: its time, its size
and its speaker's name. Each check raises ValueError with a sentence a client can read."""

import json
import unicodedata
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.utils import timezone

from conversations.models import Message

# When a client may say a message was written: not before the Unix epoch, and at most a day ahead of the
# server's clock (time zones and skew), so a mistyped year cannot date a message 2204 or 0024.
MESSAGE_TIME_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
MESSAGE_TIME_AHEAD = timedelta(days=1)

# The column's length, as sent: the schema's maxLength is the input's (tenants.api.StrictSerializer).
MESSAGE_NAME_MAX = cast(int, Message._meta.get_field("name").max_length)
# Unicode categories a speaker's name must not hold: control and format characters (bidi overrides, zero
# widths, which make two names look alike), surrogates, and line or paragraph separators, which would
# break the one-line labels names are shown in.
_NAME_REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def message_time_check(value: datetime) -> datetime:
    """A client's time for a message, in UTC (a naive time is taken as UTC). ValueError, with a sentence a
    client can read, when it lies outside the range above."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    # Compared before converting: near datetime's limits the conversion itself would overflow.
    if value < MESSAGE_TIME_EARLIEST:
        raise ValueError("must not be before 1970-01-01T00:00:00Z.")
    if value > timezone.now() + MESSAGE_TIME_AHEAD:
        raise ValueError("must not be more than a day in the future.")
    return value.astimezone(UTC)


def message_size(content: str, parts: list[dict[str, Any]], metadata: dict[str, Any] | None = None) -> int:
    """Bytes a message stores: its content, parts and metadata (UTF-8, compact JSON), what
    MNEMO_MAX_MESSAGE_BYTES limits."""
    size = len(content.encode())
    for value in (parts, metadata):
        if value:
            size += len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    return size


def message_name_check(value: Any) -> str:
    """A speaker's name as stored: trimmed, "" for none (absent, null, empty or blank). ValueError, with a
    sentence a client can read, when it is not a string, is longer than the column as sent, or holds a
    control character."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError("must be a string.")
    if len(value) > MESSAGE_NAME_MAX:
        raise ValueError(f"must be at most {MESSAGE_NAME_MAX} characters.")
    for char in value:
        if unicodedata.category(char) in _NAME_REFUSED_CATEGORIES:
            raise ValueError(f"must not contain control characters (found U+{ord(char):04X}).")
    return value.strip()
