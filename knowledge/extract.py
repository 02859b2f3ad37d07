"""Text out of uploaded files, as blocks with their provenance: PDF pages (pypdf), DOCX paragraphs and
tables under their headings (python-docx), XLSX rows per sheet (openpyxl), PPTX slides (python-pptx),
Markdown and HTML under their headings (BeautifulSoup on the stdlib parser), CSV rows and plain text.

A block is the smallest unit chunking keeps whole when it can (a paragraph, a table row, a slide's text);
blocks of one section (same page, heading path and sheet) may share a chunk, blocks of two never do."""

import csv
import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from knowledge.languages import language_for


class ExtractionError(Exception):
    """A file that cannot be read: `code` is machine-readable, the message says why in a sentence."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Block:
    text: str
    page: int | None = None
    heading: str = ""
    sheet: str = ""
    row: int | None = None  # spreadsheet/CSV row, 1-based
    columns: int = 0  # cells in that row (for the cell range)
    start_line: int | None = None
    end_line: int | None = None

    @property
    def section(self) -> tuple[object, ...]:
        return (self.page, self.heading, self.sheet)


EXTENSIONS = {
    ".pdf": "pdf",
    ".docx": "docx",
    ".xlsx": "xlsx",
    ".xlsm": "xlsx",
    ".pptx": "pptx",
    ".md": "markdown",
    ".markdown": "markdown",
    ".htm": "html",
    ".html": "html",
    ".txt": "text",
    ".text": "text",
    ".rst": "text",
    ".log": "text",
    ".csv": "csv",
    ".tsv": "csv",
}
ARCHIVES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def detect_format(name: str, head: bytes) -> str | None:
    """The format a file is read as, from its name and first bytes; None when no reader takes it. A code
    file answers "code", an archive "archive"."""
    lower = name.lower()
    if lower.endswith(ARCHIVES):
        return "archive"
    suffix = PurePosixPath(lower).suffix
    if suffix in EXTENSIONS:
        return EXTENSIONS[suffix]
    if language_for(lower):
        return "code"
    if head.startswith(b"%PDF-"):
        return "pdf"
    if head.startswith(b"PK\x03\x04"):
        return "archive"
    if head.startswith(b"\x1f\x8b") or head[257:262] == b"ustar":
        return "archive"
    return "text" if looks_textual(head) else None


def looks_textual(head: bytes) -> bool:
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start > len(head) - 4  # a multi-byte character cut by the sample's end
    return True


def decode_text(data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise ExtractionError("binary_file", "The file holds binary data, not text.")
    for encoding in ("utf-8-sig", "cp1252"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    return data.decode("latin-1")


# --- plain text, Markdown, CSV ---------------------------------------------------------------------------

_BLANK = re.compile(r"\n[ \t]*\n")


def paragraphs_with_lines(text: str) -> Iterator[tuple[str, int, int]]:
    """(paragraph, first line, last line), 1-based, for each run of non-blank lines."""
    start = 0
    for match in [*_BLANK.finditer(text), None]:
        end = match.start() if match else len(text)
        piece = text[start:end]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip("\n"))
            first = text.count("\n", 0, start + lead) + 1
            yield piece.strip(), first, first + piece.strip().count("\n")
        if match:
            start = match.end() - 1  # keep the newline so line counts stay right


def extract_text(data: bytes) -> list[Block]:
    return [Block(p, start_line=a, end_line=b) for p, a, b in paragraphs_with_lines(decode_text(data))]


_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def extract_markdown(data: bytes) -> list[Block]:
    """Paragraphs under their heading path ("Install > Linux"); a fenced code block stays one block."""
    lines = decode_text(data).splitlines()
    blocks: list[Block] = []
    path: list[str] = []
    current: list[str] = []
    first = 0
    fenced = False

    def flush(last: int) -> None:
        if "".join(current).strip():
            text = "\n".join(current).strip()
            blocks.append(Block(text, heading=" > ".join(path), start_line=first, end_line=last))
        current.clear()

    for number, line in enumerate(lines, 1):
        if _FENCE.match(line):
            fenced = not fenced
        heading = None if fenced else _MD_HEADING.match(line)
        if heading or (not fenced and not line.strip()):
            flush(number - 1)
            if heading:
                level = len(heading.group(1))
                path[level - 1 :] = [heading.group(2).strip()]
                blocks.append(
                    Block(line.strip(), heading=" > ".join(path), start_line=number, end_line=number)
                )
            continue
        if not current:
            first = number
        current.append(line)
    flush(len(lines))
    return blocks


def _column_letters(index: int) -> str:
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(65 + rest) + letters
    return letters


def cell_range(first_row: int, last_row: int, columns: int) -> str:
    return f"A{first_row}:{_column_letters(max(columns, 1) - 1)}{last_row}"


def _row_blocks(rows: Iterator[list[str]], *, sheet: str = "") -> list[Block]:
    """Rows as "header: value" lines when the first row reads as a header (all text), else cells joined."""
    blocks: list[Block] = []
    header: list[str] | None = None
    for number, cells in enumerate(rows, 1):
        cells = [c.strip() for c in cells]
        if not any(cells):
            continue
        if number == 1 and all(c and not _NUMBER.fullmatch(c) for c in cells):
            header = cells
            text = " | ".join(cells)
        elif header:
            text = "; ".join(f"{h}: {v}" if h else v for h, v in zip(header, cells, strict=False) if v)
        else:
            text = " | ".join(cells)
        blocks.append(Block(text, sheet=sheet, row=number, columns=len(cells)))
    return blocks


_NUMBER = re.compile(r"[-+]?[\d.,]+%?")


def extract_csv(data: bytes) -> list[Block]:
    text = decode_text(data)
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    try:
        return _row_blocks(iter(csv.reader(io.StringIO(text), dialect)))
    except csv.Error as exc:
        raise ExtractionError("corrupt_file", f"The CSV file could not be read: {exc}.") from None


# --- office formats and PDF --------------------------------------------------------------------------------


def extract_pdf(data: bytes) -> list[Block]:
    # A reader's library loads only when a file of its format arrives: a server that is never sent one
    # does not pay for it.
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ExtractionError("encrypted_file", "The PDF is encrypted with a password.")
        blocks = []
        for number, page in enumerate(reader.pages, 1):
            for paragraph, _a, _b in paragraphs_with_lines(page.extract_text() or ""):
                blocks.append(Block(paragraph, page=number))
    except ExtractionError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ExtractionError("corrupt_file", f"The PDF could not be read ({type(exc).__name__}).") from None
    if not blocks and len(reader.pages):
        raise ExtractionError("no_text", "The PDF has no text layer (a scan?); nothing to index.")
    return blocks


def extract_docx(data: bytes) -> list[Block]:
    """Paragraphs and table rows in body order, each under the heading path it follows."""
    # A reader's library loads only when a file of its format arrives: a server that is never sent one
    # does not pay for it.
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    document = docx.Document(io.BytesIO(data))
    blocks: list[Block] = []
    path: list[str] = []
    for item in document.iter_inner_content():
        if isinstance(item, Paragraph):
            text = item.text.strip()
            level = _heading_level(item.style.name if item.style is not None else "")
            if level and text:
                path[level - 1 :] = [text]
            if text:
                blocks.append(Block(text, heading=" > ".join(path)))
        elif isinstance(item, Table):
            rows = ([cell.text for cell in row.cells] for row in item.rows)
            for block in _row_blocks(rows):
                blocks.append(replace(block, heading=" > ".join(path), row=None, columns=0))
    return blocks


def _heading_level(style: str) -> int:
    if style == "Title":
        return 1
    match = re.fullmatch(r"Heading (\d)", style)
    return int(match.group(1)) if match else 0


def extract_xlsx(data: bytes) -> list[Block]:
    # A reader's library loads only when a file of its format arrives: a server that is never sent one
    # does not pay for it.
    import openpyxl

    workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        blocks: list[Block] = []
        for sheet in workbook.worksheets:
            rows = (["" if v is None else str(v) for v in row] for row in sheet.iter_rows(values_only=True))
            blocks += _row_blocks(rows, sheet=sheet.title)
        return blocks
    finally:
        workbook.close()


def extract_pptx(data: bytes) -> list[Block]:
    """One block per text frame, the slide number as the page and its title as the heading."""
    # A reader's library loads only when a file of its format arrives: a server that is never sent one
    # does not pay for it.
    from pptx import Presentation

    presentation = Presentation(io.BytesIO(data))
    blocks: list[Block] = []
    for number, slide in enumerate(presentation.slides, 1):
        title_shape = slide.shapes.title
        title = title_shape.text_frame.text.strip() if title_shape is not None else ""
        for shape in slide.shapes:
            if shape.has_text_frame and shape.text_frame.text.strip():
                blocks.append(Block(shape.text_frame.text.strip(), page=number, heading=title))
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            notes = slide.notes_slide.notes_text_frame.text.strip()
            if notes:
                blocks.append(Block(f"Notes: {notes}", page=number, heading=title))
    return blocks


# --- HTML ---------------------------------------------------------------------------------------------------

_HTML_BLOCKS = ("p", "li", "pre", "blockquote", "td", "th", "dt", "dd", "figcaption", "caption")
_HTML_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")


def extract_html(data: bytes) -> list[Block]:
    """Text of the innermost block elements in document order under their heading path; scripts, styles
    and navigation dropped. Text outside any block element (a bare <body>) is one block per line run."""
    # A reader's library loads only when a file of its format arrives: a server that is never sent one
    # does not pay for it.
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(decode_text(data), "html.parser")
    for tag in soup(["script", "style", "noscript", "template", "nav", "svg"]):
        tag.decompose()
    blocks: list[Block] = []
    path: list[str] = []
    names = (*_HTML_HEADINGS, *_HTML_BLOCKS, "tr")
    for element in soup.find_all(names):
        if element.name in _HTML_HEADINGS:
            text = element.get_text(" ", strip=True)
            if text:
                path[int(element.name[1]) - 1 :] = [text]
                blocks.append(Block(text, heading=" > ".join(path)))
        elif element.find(names) is None or element.name == "tr":
            if element.name != "tr" and element.find_parent("tr") is not None:
                continue  # the row speaks for its cells
            separator = " | " if element.name == "tr" else " "
            text = element.get_text(separator, strip=True)
            if text:
                blocks.append(Block(text, heading=" > ".join(path)))
    if not blocks:
        return extract_text(soup.get_text("\n").encode())
    return blocks


EXTRACTORS: dict[str, Callable[[bytes], list[Block]]] = {
    "pdf": extract_pdf,
    "docx": extract_docx,
    "xlsx": extract_xlsx,
    "pptx": extract_pptx,
    "markdown": extract_markdown,
    "html": extract_html,
    "text": extract_text,
    "csv": extract_csv,
}


def extract(format_name: str, data: bytes) -> list[Block]:
    """The file's blocks; ExtractionError when the file cannot be read (corrupt, encrypted, not the format
    its name says)."""
    try:
        return EXTRACTORS[format_name](data)
    except ExtractionError:
        raise
    except Exception as exc:  # each library raises its own zoo (BadZipFile, KeyError, lxml errors…)
        raise ExtractionError(
            "corrupt_file", f"The {format_name.upper()} file could not be read ({type(exc).__name__})."
        ) from None
