"""Code: tree-sitter chunks per function/method/class for Python, TypeScript, JavaScript, Java and Go,
windows of lines elsewhere; repository archives and their guards."""

import io
import zipfile

import pytest

from knowledge.archives import ArchiveReport, archive_members
from knowledge.code import code_chunks
from knowledge.conf import knowledge_limits
from knowledge.extract import ExtractionError
from knowledge.models import Chunk, Document
from tests.knowledge.conftest import upload
from tests.knowledge.files import GO_SOURCE, JAVA_SOURCE, PYTHON_SOURCE, TS_SOURCE, tar_bytes, zip_bytes


def symbols(path, data):
    return {(c.symbol, c.start_line, c.end_line) for c in code_chunks(path, data) if c.symbol}


def test_python_functions_methods_and_class_skeleton():
    chunks = {c.symbol: c for c in code_chunks("billing.py", PYTHON_SOURCE)}
    assert set(chunks) == {"", "Invoice", "Invoice.__init__", "Invoice.render_invoice", "getUsername"}
    method = chunks["Invoice.render_invoice"]
    assert (method.start_line, method.end_line, method.language) == (14, 16, "python")
    assert "Render the invoice" in method.content
    skeleton = chunks["Invoice"].content
    assert "def render_invoice" in skeleton and "printable document" not in skeleton
    assert "import decimal" in chunks[""].content  # module code outside definitions


def test_typescript_java_go():
    assert {s for s, _a, _b in symbols("api.ts", TS_SOURCE)} == {
        "HTTPServerError", "HTTPServerError.constructor", "fetchCustomerAccount", "parseInvoiceTotal",
    }  # fmt: skip
    fetch = next(c for c in code_chunks("api.ts", TS_SOURCE) if c.symbol == "fetchCustomerAccount")
    assert fetch.content.startswith("/** Fetch the account")  # its doc comment comes with it
    assert ("LedgerService.postLedgerEntry", 4, 7) in symbols("Ledger.java", JAVA_SOURCE)
    assert {s for s, _a, _b in symbols("fees.go", GO_SOURCE)} == {
        "ComputeLateFee",
        "Server",
        "Server.ServeRefunds",
    }
    assert symbols("app.jsx", b"function App() { return 1 }\n") == {("App", 1, 1)}


def test_long_functions_and_unknown_languages_become_line_windows():
    body = "\n".join(f"    total += compute_value_{i}(argument_{i})" for i in range(400))
    chunks = code_chunks("big.py", f"def huge():\n    total = 0\n{body}\n    return total\n".encode())
    assert len(chunks) > 2 and all(c.symbol == "huge" and c.tokens <= 500 for c in chunks)
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 403
    rust = code_chunks("lib.rs", b'fn main() {\n    println!("hi");\n}\n')
    assert [(c.language, c.start_line, c.end_line, c.symbol) for c in rust] == [("rust", 1, 3, "")]


def test_broken_source_still_chunks():
    chunks = code_chunks("broken.py", b"def ok():\n    return 1\n\ndef broken(:\n    pass\n")
    assert any(c.symbol == "ok" for c in chunks)
    assert "broken" in "\n".join(c.content for c in chunks)


LIMITS = knowledge_limits()


def members(data, limits=LIMITS):
    report = ArchiveReport()
    return dict(archive_members(data, limits, report)), report


def test_zip_and_tar_members_with_links_skipped():
    files = {
        "repo/src/a.py": b"def a():\n    pass\n",
        "repo/node_modules/x.js": b"x",
        "repo/README.md": b"# R",
    }
    found, report = members(zip_bytes(files, symlinks={"repo/link": "/etc/passwd"}))
    assert set(found) == {"repo/src/a.py", "repo/README.md"}
    assert report.skipped == [{"path": "repo/link", "reason": "symlink"}]
    found, report = members(tar_bytes(files, links={"repo/l": "../../etc"}))
    assert set(found) == {"repo/src/a.py", "repo/README.md"}
    assert report.skipped == [{"path": "repo/l", "reason": "link"}]


@pytest.mark.parametrize("name", ["../evil.py", "/etc/passwd", "a/../../b.py", "C:/x.py"])
def test_path_traversal_fails_the_archive(name):
    for data in (zip_bytes({name: b"x"}), tar_bytes({name: b"x"})):
        with pytest.raises(ExtractionError) as caught:
            members(data)
        assert caught.value.code == "unsafe_archive"


def test_zip_bomb_is_refused_before_it_is_unpacked():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("zeros.txt", b"\0" * (20 * 1024 * 1024))
    with pytest.raises(ExtractionError) as caught:
        members(out.getvalue())
    assert caught.value.code == "zip_bomb"
    bomb_tar = tar_bytes({"zeros.txt": b"\0" * (20 * 1024 * 1024)})
    with pytest.raises(ExtractionError) as caught:
        members(bomb_tar)
    assert caught.value.code == "zip_bomb"


def test_member_count_and_size_limits():
    from dataclasses import replace

    many = zip_bytes({f"f{i}.py": b"x = 1\n" for i in range(5)})
    with pytest.raises(ExtractionError) as caught:
        members(many, replace(LIMITS, archive_members=3))
    assert caught.value.code == "archive_too_large"
    found, report = members(
        zip_bytes({"big.py": b"x" * 100, "small.py": b"y"}), replace(LIMITS, archive_member_bytes=50)
    )
    assert set(found) == {"small.py"} and report.skipped == [{"path": "big.py", "reason": "too_large"}]


@pytest.mark.django_db
def test_repository_upload_end_to_end(owner):
    archive = tar_bytes(
        {
            "shop/billing.py": PYTHON_SOURCE,
            "shop/api.ts": TS_SOURCE,
            "shop/docs/guide.md": b"# Guide\n\nRun it.",
            "shop/logo.png": b"\x89PNG\r\n\x1a\n\x00\x00binary",
        }
    )
    [row] = upload(owner, ("shop.tar.gz", archive)).json()["documents"]
    document = Document.objects.get(pk=row["id"])
    assert (document.kind, document.status) == ("code", "ready")
    assert document.details["files"] == 3
    assert {"path": "shop/logo.png", "reason": "unsupported_type"} in document.details["skipped"]
    paths = set(Chunk.objects.filter(document=document).values_list("path", flat=True))
    assert paths == {"shop/billing.py", "shop/api.ts", "shop/docs/guide.md"}


@pytest.mark.django_db
def test_bad_archives_fail_the_document_with_a_reason(owner):
    rows = upload(
        owner,
        ("evil.zip", zip_bytes({"../../etc/cron.d/x": b"* * * * * root sh"})),
        ("cut.zip", b"PK\x03\x04junk"),
    ).json()["documents"]
    states = {r["name"]: Document.objects.get(pk=r["id"]) for r in rows}
    assert (states["evil.zip"].status, states["evil.zip"].error_code) == ("failed", "unsafe_archive")
    assert (states["cut.zip"].status, states["cut.zip"].error_code) == ("failed", "corrupt_file")
    assert not Chunk.objects.exists()
