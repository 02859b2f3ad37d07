"""Small real files for the knowledge tests, each written by the real library of its format (a PDF by hand:
no PDF writer is installed, and the few objects of a text PDF are easy to write exactly)."""

import io
import tarfile
import zipfile


def pdf_bytes(pages: list[list[str]]) -> bytes:
    """A valid PDF: one page per entry, each line of text a line on the page (Helvetica)."""
    objects: list[bytes] = []
    count = len(pages)
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(count))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {count} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, lines in enumerate(pages):
        escaped = [line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for line in lines]
        body = "BT /F1 12 Tf 14 TL 72 720 Td " + " ".join(f"({t}) Tj T*" for t in escaped) + " ET"
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * i} 0 R "
            "/Resources << /Font << /F1 3 0 R >> >> >>".encode()
        )
        stream = body.encode("latin-1")
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, obj in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + obj + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def docx_bytes() -> bytes:
    import docx

    document = docx.Document()
    document.add_heading("Requirements", level=1)
    document.add_paragraph("The billing service must export invoices as PDF every night.")
    document.add_heading("Security", level=2)
    document.add_paragraph("Passwords are hashed with Argon2id and never logged.")
    table = document.add_table(rows=2, cols=2)
    table.cell(0, 0).text = "Owner"
    table.cell(0, 1).text = "Deadline"
    table.cell(1, 0).text = "Margaret"
    table.cell(1, 1).text = "2027-03-01"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def xlsx_bytes() -> bytes:
    import openpyxl

    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.title = "Budget"
    sheet.append(["Item", "Cost", "Quarter"])
    sheet.append(["GPU cluster", 120000, "Q1"])
    sheet.append(["Office rent", 45000, "Q2"])
    other = workbook.create_sheet("Staff")
    other.append(["Name", "Role"])
    other.append(["Priya", "Platform lead"])
    out = io.BytesIO()
    workbook.save(out)
    return out.getvalue()


def pptx_bytes() -> bytes:
    from pptx import Presentation

    presentation = Presentation()
    for title, text in (
        ("Roadmap", "Launch the mobile app in May."),
        ("Risks", "Vendor lock-in on storage."),
    ):
        slide = presentation.slides.add_slide(presentation.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = text
    out = io.BytesIO()
    presentation.save(out)
    return out.getvalue()


def zip_bytes(files: dict[str, bytes], *, symlinks: dict[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = 0o120777 << 16
            archive.writestr(info, target)
    return out.getvalue()


def tar_bytes(files: dict[str, bytes], *, mode: str = "w:gz", links: dict[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            archive.addfile(info)
    return out.getvalue()


PYTHON_SOURCE = b'''"""Billing."""

import decimal

TAX = decimal.Decimal("0.2")


class Invoice:
    """An invoice of one customer."""

    def __init__(self, lines):
        self.lines = lines

    def render_invoice(self, fmt="pdf"):
        """Render the invoice as a printable document."""
        return f"{fmt}:{len(self.lines)}"


def getUsername(user):
    return user.name
'''

TS_SOURCE = b"""export class HTTPServerError extends Error {
  constructor(public status: number) { super(String(status)); }
}

/** Fetch the account of a customer. */
export async function fetchCustomerAccount(id: string): Promise<string> {
  return id;
}

export const parseInvoiceTotal = (text: string) => Number(text);
"""

JAVA_SOURCE = b"""package billing;

public class LedgerService {
    // Post an entry to the general ledger.
    public void postLedgerEntry(String account, long cents) {
        System.out.println(account + cents);
    }
}
"""

GO_SOURCE = b"""package billing

// ComputeLateFee returns the fee for an overdue invoice.
func ComputeLateFee(days int) int {
	return days * 5
}

type Server struct{}

func (s *Server) ServeRefunds() error { return nil }
"""
