"""Knowledge limits. Each is a setting (config/django/base.py may set it; these are the defaults) that a
tenant's `settings` JSON can lower or raise under the same key in lower case (e.g. document_max_bytes)."""

from dataclasses import dataclass
from typing import Any

from django.conf import settings

DEFAULTS = {
    # One uploaded file (the request as a whole is also held to MNEMO_MAX_REQUEST_BYTES).
    "MNEMO_DOCUMENT_MAX_BYTES": 16 * 1024 * 1024,
    "MNEMO_DOCUMENT_MAX_FILES": 20,
    # Archives: members, bytes once unpacked, the largest member read, and the unpacked/packed ratio past
    # which an archive is a bomb, not a repository.
    "MNEMO_ARCHIVE_MAX_MEMBERS": 20_000,
    "MNEMO_ARCHIVE_MAX_BYTES": 200 * 1024 * 1024,
    "MNEMO_ARCHIVE_MAX_MEMBER_BYTES": 2 * 1024 * 1024,
    "MNEMO_ARCHIVE_MAX_RATIO": 100,
    # Text extracted from one document: past this the document fails instead of filling the table.
    "MNEMO_DOCUMENT_MAX_CHUNKS": 50_000,
}


def _setting(name: str) -> int:
    return int(getattr(settings, name, DEFAULTS[name]))


@dataclass(frozen=True)
class KnowledgeLimits:
    max_bytes: int
    max_files: int
    archive_members: int
    archive_bytes: int
    archive_member_bytes: int
    archive_ratio: int
    max_chunks: int


def knowledge_limits(tenant_settings: dict[str, Any] | None = None) -> KnowledgeLimits:
    own = tenant_settings or {}

    def pick(name: str) -> int:
        value = own.get(name.removeprefix("MNEMO_").lower())
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return _setting(name)

    return KnowledgeLimits(
        max_bytes=pick("MNEMO_DOCUMENT_MAX_BYTES"),
        max_files=pick("MNEMO_DOCUMENT_MAX_FILES"),
        archive_members=pick("MNEMO_ARCHIVE_MAX_MEMBERS"),
        archive_bytes=pick("MNEMO_ARCHIVE_MAX_BYTES"),
        archive_member_bytes=pick("MNEMO_ARCHIVE_MAX_MEMBER_BYTES"),
        archive_ratio=pick("MNEMO_ARCHIVE_MAX_RATIO"),
        max_chunks=pick("MNEMO_DOCUMENT_MAX_CHUNKS"),
    )
