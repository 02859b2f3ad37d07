"""From a stored document's bytes to chunk drafts: the format's reader and the chunker for documents,
tree-sitter (or windows of lines) for code files, and both, file by file, for a repository archive."""

from dataclasses import dataclass, field
from typing import Any

from knowledge.archives import ArchiveReport, archive_members
from knowledge.chunking import Draft, chunk_blocks
from knowledge.code import code_chunks
from knowledge.conf import KnowledgeLimits
from knowledge.extract import ExtractionError, detect_format, extract, looks_textual


@dataclass
class Ingested:
    drafts: list[Draft]
    details: dict[str, Any] = field(default_factory=dict)


def _file_drafts(path: str, data: bytes, format_name: str) -> list[Draft]:
    if format_name == "code":
        return code_chunks(path, data)
    drafts = chunk_blocks(extract(format_name, data))
    for draft in drafts:
        draft.path = path
        draft.language = format_name
    return drafts


def _archive_drafts(data: bytes, limits: KnowledgeLimits) -> Ingested:
    report = ArchiveReport()
    drafts: list[Draft] = []
    indexed = 0
    for path, content in archive_members(data, limits, report):
        format_name = detect_format(path, content[:512])
        if (
            format_name is None
            or format_name == "archive"
            or (format_name in ("text", "code") and not looks_textual(content[:4096]))
        ):
            report.skip(path, "unsupported_type")
            continue
        try:
            drafts += _file_drafts(path, content, format_name)
        except ExtractionError as exc:  # one unreadable file does not sink the repository
            report.skip(path, exc.code)
            continue
        indexed += 1
        if len(drafts) > limits.max_chunks:
            raise ExtractionError(
                "too_many_chunks", f"The archive yields more than {limits.max_chunks} chunks."
            )
    details = {"files": indexed, "members": report.members, "skipped": report.skipped}
    if not indexed:
        raise ExtractionError("no_text", "The archive holds no file Mnemo can index.")
    return Ingested(drafts, details)


def ingest(*, name: str, format_name: str, data: bytes, limits: KnowledgeLimits) -> Ingested:
    """The drafts of one uploaded file; ExtractionError when it cannot be indexed."""
    if format_name == "archive":
        return _archive_drafts(data, limits)
    drafts = _file_drafts(name, data, format_name)
    if not drafts:
        raise ExtractionError("no_text", "The file holds no text to index.")
    if len(drafts) > limits.max_chunks:
        raise ExtractionError("too_many_chunks", f"The file yields more than {limits.max_chunks} chunks.")
    pages = {d.page for d in drafts if d.page is not None}
    return Ingested(drafts, {"pages": max(pages)} if pages else {})
