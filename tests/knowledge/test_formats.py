"""Each format read from a real small file written by its own library, with its provenance; and the
failures a reader meets (corrupt, encrypted, no text)."""

import itertools

import pytest

from knowledge.chunking import MAX_TOKENS, chunk_blocks
from knowledge.extract import Block, ExtractionError, detect_format, extract
from tests.knowledge.files import docx_bytes, pdf_bytes, pptx_bytes, xlsx_bytes


def chunks_of(format_name: str, data: bytes):
    return chunk_blocks(extract(format_name, data))


def test_pdf_pages():
    chunks = chunks_of("pdf", pdf_bytes([["Alpha (first) page."], ["Beta page", "second line"]]))
    assert [(c.page, c.content) for c in chunks] == [
        (1, "Alpha (first) page."),
        (2, "Beta page\nsecond line"),
    ]


def test_docx_headings_and_tables():
    chunks = chunks_of("docx", docx_bytes())
    by_heading = {c.heading: c.content for c in chunks}
    assert "export invoices as PDF" in by_heading["Requirements"]
    security = by_heading["Requirements > Security"]
    assert "Argon2id" in security and "Owner: Margaret; Deadline: 2027-03-01" in security


def test_xlsx_sheets_and_cell_ranges():
    chunks = chunks_of("xlsx", xlsx_bytes())
    assert [(c.sheet, c.cell_range) for c in chunks] == [("Budget", "A1:C3"), ("Staff", "A1:B2")]
    assert "Item: GPU cluster; Cost: 120000; Quarter: Q1" in chunks[0].content


def test_pptx_slides():
    chunks = chunks_of("pptx", pptx_bytes())
    assert [(c.page, c.heading) for c in chunks] == [(1, "Roadmap"), (2, "Risks")]
    assert "mobile app in May" in chunks[0].content


def test_markdown_heading_path_and_lines():
    text = b"# Guide\n\nIntro words.\n\n## Install\n\nRun make.\n\n```\n# not a heading\n\nstill code\n```\n"
    chunks = chunks_of("markdown", text)
    install = next(c for c in chunks if c.heading == "Guide > Install")
    assert "# not a heading" in install.content and "still code" in install.content
    assert (install.start_line, install.end_line) == (5, 13)


def test_html_headings_paragraphs_and_rows():
    html = b"""<html><head><style>p{}</style><script>var secret=1</script></head><body>
    <h1>Pricing</h1><p>Plans start at <b>9 EUR</b>.</p>
    <table><tr><th>Plan</th><th>Seats</th></tr><tr><td><p>Team</p></td><td>10</td></tr></table>
    <h2>FAQ</h2><ul><li><p>Cancel any time.</p></li></ul></body></html>"""
    chunks = chunks_of("html", html)
    text = "\n".join(c.content for c in chunks)
    assert "Plans start at 9 EUR ." in text and "Team | 10" in text and "secret" not in text
    assert text.count("Team") == 1
    assert any(c.heading == "Pricing > FAQ" and "Cancel any time." in c.content for c in chunks)


def test_csv_and_plain_text():
    rows = chunks_of("csv", b"city;population\nLyon;522000\nNantes;320000\n")
    assert rows[0].cell_range == "A1:B3" and "city: Lyon; population: 522000" in rows[0].content
    text = chunks_of("text", "First paragraph.\n\nSecond, café.\n".encode())
    assert (text[0].start_line, text[0].end_line) == (1, 3)


def test_long_sections_are_split_with_overlap_and_never_exceed_the_maximum():
    paragraphs = [
        Block(f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 20, heading="H") for i in range(30)
    ]
    giant = Block("word " * 3000, heading="G")
    chunks = chunk_blocks([*paragraphs, giant])
    assert all(c.tokens <= MAX_TOKENS for c in chunks)
    h_chunks = [c for c in chunks if c.heading == "H"]
    assert len(h_chunks) > 3
    # Each chunk after the first starts with the end of the one before (the overlap).
    for before, after in itertools.pairwise(h_chunks):
        overlap = after.content.split("\n\n")[0]
        assert (
            before.content.rstrip().endswith(overlap.strip()) and 0 < len(overlap) < len(before.content) // 3
        )
    assert {c.heading for c in chunks} == {"H", "G"}


@pytest.mark.parametrize(
    ("name", "head", "expected"),
    [
        ("a.pdf", b"", "pdf"),
        ("noext", b"%PDF-1.7", "pdf"),
        ("repo.tar.gz", b"", "archive"),
        ("src/app.ts", b"", "code"),
        ("README", b"plain words", "text"),
        ("blob", b"\x00\x01", None),
    ],
)
def test_detect_format(name, head, expected):
    assert detect_format(name, head) == expected


def test_encrypted_pdf_fails_with_a_reason():
    from io import BytesIO

    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    writer.append(PdfReader(BytesIO(pdf_bytes([["secret plans"]]))))
    writer.encrypt("hunter2", algorithm="RC4-128")
    out = BytesIO()
    writer.write(out)
    with pytest.raises(ExtractionError) as caught:
        extract("pdf", out.getvalue())
    assert caught.value.code == "encrypted_file"


@pytest.mark.parametrize("format_name", ["pdf", "docx", "xlsx", "pptx"])
def test_corrupt_files_fail_with_a_reason(format_name):
    with pytest.raises(ExtractionError) as caught:
        extract(format_name, b"PK\x03\x04 truncated garbage")
    assert caught.value.code == "corrupt_file"
