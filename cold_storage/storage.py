"""The storage backends image bytes go through. Any Django storage works (settings.STORAGES aliases
"images_hot" and "images_cold"); the default writes files under MEDIA_ROOT with a write-then-link so that a
crash mid-write never leaves a half file under the final name."""

import os
import tempfile
from typing import Any

from django.conf import settings
from django.core.files.storage import FileSystemStorage, Storage, storages
from django.utils.functional import cached_property

HOT = "hot"
COLD = "cold"
_ALIASES = {HOT: "images_hot", COLD: "images_cold"}


def tier_storage(tier: str) -> Storage:
    return storages[_ALIASES[tier]]


class AtomicFileSystemStorage(FileSystemStorage):
    """FileSystemStorage that writes a temporary file in the target folder, fsyncs it and hard-links it
    into place (never overwriting: a taken name gets a fresh one, as with the stock backend).

    ``subdirectory`` places the files under MEDIA_ROOT/<subdirectory> when no ``location`` is given, so the
    tiers follow MEDIA_ROOT (and a test's throwaway MEDIA_ROOT)."""

    def __init__(self, *args: Any, subdirectory: str = "", fsync: bool = True, **kwargs: Any) -> None:
        self._subdirectory = subdirectory
        self._fsync = fsync
        super().__init__(*args, **kwargs)

    @cached_property
    def base_location(self) -> str:
        # django-stubs do not declare _location (the ``location`` given to FileSystemStorage.__init__).
        location = self._location  # type: ignore[attr-defined]
        return self._value_or_setting(location, os.path.join(settings.MEDIA_ROOT, self._subdirectory))

    def _save(self, name: str, content: Any) -> str:
        full_path = self.path(name)
        directory = os.path.dirname(full_path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp_path = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as tmp:
                for chunk in content.chunks():
                    tmp.write(chunk if isinstance(chunk, bytes) else chunk.encode())
                tmp.flush()
                if self._fsync:
                    os.fsync(tmp.fileno())
            if self.file_permissions_mode is not None:
                os.chmod(tmp_path, self.file_permissions_mode)
            while True:
                try:
                    os.link(tmp_path, full_path)
                    break
                except FileExistsError:
                    name = self.get_available_name(name)
                    full_path = self.path(name)
        finally:
            os.unlink(tmp_path)
        return str(name).replace("\\", "/")
