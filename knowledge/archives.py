"""Reading a repository archive (zip or tar, compressed or not) without trusting it: the member count, the
bytes once unpacked and the unpacked/packed ratio are capped (a zip bomb fails the document before it is
unpacked, and the read itself stops at the caps whatever the headers claim); a path that climbs out of the
archive (`../`, absolute, drive letters) fails it; links, devices and oversized, binary or vendored files
are skipped and listed. Nothing is written to disk."""

import io
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO

from knowledge.conf import KnowledgeLimits
from knowledge.extract import ExtractionError

# Folders no one asks questions about: version control, dependencies, build output.
SKIPPED_DIRECTORIES = frozenset(
    {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".tox", "dist", "build", ".idea"}
)


@dataclass
class ArchiveReport:
    skipped: list[dict[str, str]] = field(default_factory=list)
    members: int = 0
    unpacked_bytes: int = 0

    def skip(self, path: str, reason: str) -> None:
        if len(self.skipped) < 200:  # the first ones say enough
            self.skipped.append({"path": path, "reason": reason})


def safe_path(name: str) -> str:
    """The member's path inside the archive, or ExtractionError when it points outside it."""
    clean = name.replace("\\", "/")
    parts = PurePosixPath(clean).parts
    if clean.startswith("/") or ".." in parts or (parts and parts[0].endswith(":")):
        raise ExtractionError("unsafe_archive", f"The archive holds a path outside itself: {name[:200]!r}.")
    return "/".join(p for p in parts if p not in (".", ""))


def _read_capped(handle: IO[bytes], cap: int) -> bytes | None:
    data = handle.read(cap + 1)
    return None if len(data) > cap else data


class _Budget:
    def __init__(self, limits: KnowledgeLimits, packed: int, report: ArchiveReport) -> None:
        self.limits, self.packed, self.report = limits, max(packed, 1), report

    def admit(self, declared: int) -> None:
        report, limits = self.report, self.limits
        report.members += 1
        report.unpacked_bytes += declared
        if report.members > limits.archive_members:
            raise ExtractionError(
                "archive_too_large", f"The archive holds more than {limits.archive_members} files."
            )
        if report.unpacked_bytes > limits.archive_bytes:
            raise ExtractionError(
                "archive_too_large", f"The archive unpacks to more than {limits.archive_bytes} bytes."
            )
        if report.unpacked_bytes > 1024 * 1024 and report.unpacked_bytes / self.packed > limits.archive_ratio:
            raise ExtractionError(
                "zip_bomb",
                f"The archive unpacks to more than {limits.archive_ratio} times its size: refused as a bomb.",
            )


def _wanted(path: str, size: int, limits: KnowledgeLimits, report: ArchiveReport) -> bool:
    if any(part in SKIPPED_DIRECTORIES for part in path.split("/")[:-1]):
        return False  # not listed: a node_modules holds thousands
    if size > limits.archive_member_bytes:
        report.skip(path, "too_large")
        return False
    return True


def archive_members(
    data: bytes, limits: KnowledgeLimits, report: ArchiveReport
) -> Iterator[tuple[str, bytes]]:
    """(path, bytes) of each regular file worth reading, in archive order."""
    if zipfile.is_zipfile(io.BytesIO(data)):
        yield from _zip_members(data, limits, report)
        return
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115 - read as it streams
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ExtractionError(
            "corrupt_file", f"The archive could not be read ({type(exc).__name__})."
        ) from None
    yield from _tar_members(archive, len(data), limits, report)


def _zip_members(data: bytes, limits: KnowledgeLimits, report: ArchiveReport) -> Iterator[tuple[str, bytes]]:
    budget = _Budget(limits, len(data), report)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
        for info in infos:  # every header is checked before anything is unpacked
            safe_path(info.filename)
            if not info.is_dir():
                budget.admit(info.file_size)
        for info in infos:
            path = safe_path(info.filename)
            mode = info.external_attr >> 16
            if info.is_dir():
                continue
            if mode & 0o170000 == 0o120000:
                report.skip(path, "symlink")
                continue
            if not _wanted(path, info.file_size, limits, report):
                continue
            with archive.open(info) as handle:
                content = _read_capped(handle, limits.archive_member_bytes)
            if content is None:  # the header lied about the size
                raise ExtractionError("zip_bomb", f"{path} unpacks to more than its header says.")
            yield path, content
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, NotImplementedError) as exc:
        raise ExtractionError("corrupt_file", f"The zip archive could not be read ({exc}).") from None


def _tar_members(
    archive: tarfile.TarFile, packed: int, limits: KnowledgeLimits, report: ArchiveReport
) -> Iterator[tuple[str, bytes]]:
    budget = _Budget(limits, packed, report)
    try:
        for member in archive:  # a compressed tar is read as a stream: the caps apply as it goes
            path = safe_path(member.name)
            if member.isdir():
                continue
            budget.admit(member.size if member.isfile() else 0)
            if member.issym() or member.islnk():
                report.skip(path, "link")
                continue
            if not member.isfile():
                report.skip(path, "not_a_file")
                continue
            if not _wanted(path, member.size, limits, report):
                continue
            handle = archive.extractfile(member)
            content = _read_capped(handle, limits.archive_member_bytes) if handle else b""
            if content is None:
                raise ExtractionError("zip_bomb", f"{path} unpacks to more than its header says.")
            yield path, content
    except (tarfile.TarError, EOFError, OSError, zlib_error()) as exc:
        raise ExtractionError("corrupt_file", f"The tar archive could not be read ({exc}).") from None


def zlib_error() -> type[Exception]:
    return zlib.error
