"""Where document bytes live: the storage alias "documents" when settings.STORAGES names one (any Django
backend), else files under MEDIA_ROOT/documents written with cold_storage's write-then-link."""

import os

from django.conf import settings
from django.core.files.storage import Storage, storages

from cold_storage.storage import AtomicFileSystemStorage

ALIAS = "documents"
_fallback: AtomicFileSystemStorage | None = None


def document_storage() -> Storage:
    global _fallback
    if ALIAS in settings.STORAGES:
        return storages[ALIAS]
    if _fallback is None or _fallback.base_location != _expected_location():
        _fallback = AtomicFileSystemStorage(subdirectory="documents")
    return _fallback


def _expected_location() -> str:
    return os.path.join(settings.MEDIA_ROOT, "documents")
