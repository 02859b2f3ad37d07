"""One knowledge run: the corpus ingested, the queries asked, the tables.

Imported once django_setup() has run: it imports the apps at module level.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from pathlib import Path

import django as django_package
from django.core.files.uploadedfile import SimpleUploadedFile

from bench._common import log, machine_header, percentile, render_table
from bench._knowledge.corpus import corpus_files, pdf_pages, split_name, targets
from bench._knowledge.measure import grown_latency, ingest_repository, parse_only, parse_only_pdf, quality
from knowledge.models import Chunk
from knowledge.processing import document_process
from knowledge.services import Scope, documents_upload
from tenants.models import Tenant
from tenants.services import tenant_create

PDF_PAGES = 200


def ingest_row(label: str, amount: str, count: int, seconds: float) -> list[str]:
    unit = "files/s" if "files" in amount else "pages/s"
    return [label, amount, f"{seconds:.1f}", f"{count / seconds:.1f} {unit}"]


@dataclass
class Ingested:
    document_id: str
    chunks: list[Chunk]
    seconds: float  # the repository through the real path
    parse_files: float  # the repository read and chunked only
    parse_pdf: float
    pdf_seconds: float


def ingested(tenant: Tenant, files: dict[str, bytes], seed: int) -> Ingested:
    """The repository and a generated PDF of PDF_PAGES pages, each parsed alone and through the real path."""
    document_id, seconds = ingest_repository(tenant, files)
    chunks = list(Chunk.objects.filter(document_id=document_id).defer("embedding").order_by("ordinal"))
    embedded = Chunk.objects.filter(document_id=document_id, embedding__isnull=False).count()
    log(f"ingested {len(files)} files, {len(chunks)} chunks ({embedded} with vectors) in {seconds:.1f} s")
    parse_files = parse_only(files)
    pdf = pdf_pages(PDF_PAGES, random.Random(seed))
    parse_pdf = parse_only_pdf(pdf)
    started = time.perf_counter()
    [pdf_doc] = documents_upload(tenant=tenant, files=[SimpleUploadedFile("gen.pdf", pdf)], scope=Scope())
    document_process(document_id=pdf_doc.document.pk)
    pdf_seconds = time.perf_counter() - started
    pdf_doc.document.refresh_from_db()
    assert pdf_doc.document.status == "ready" and pdf_doc.document.details["pages"] == PDF_PAGES
    return Ingested(document_id, chunks, seconds, parse_files, parse_pdf, pdf_seconds)


def ingest_table(files: dict[str, bytes], got: Ingested) -> str:
    amount, pages = f"{len(files)} files", f"{PDF_PAGES} pages"
    rows = [
        ingest_row("repository: read, chunk, count tokens", amount, len(files), got.parse_files),
        ingest_row("repository: + vectors, rows (the real path)", amount, len(files), got.seconds),
        ingest_row("generated PDF: read, chunk, count tokens", pages, PDF_PAGES, got.parse_pdf),
        ingest_row("generated PDF: + vectors, rows (the real path)", pages, PDF_PAGES, got.pdf_seconds),
    ]
    return render_table(["ingest", "amount", "seconds", "rate"], rows)


def latency_table(
    tenant: Tenant, got: Ingested, latencies: list[float], queries: list[str], grow: list[int]
) -> str:
    rows = [
        [
            f"{len(got.chunks):,} (corpus)",
            f"{percentile(latencies, 50):.1f}",
            f"{percentile(latencies, 95):.1f}",
        ]
    ]
    for size in grow:
        p50, p95 = grown_latency(tenant, queries[:100], size)
        rows.append([f"{size:,}", f"{p50:.1f}", f"{p95:.1f}"])
    return render_table(["chunks in the index", "search p50 ms", "search p95 ms"], rows)


def run(args: argparse.Namespace) -> tuple[str, bool]:
    rng = random.Random(args.seed)
    root = Path(django_package.__file__).parent
    files = corpus_files(root, args.folders)
    log(f"corpus: {len(files)} files of Django {django_package.get_version()}")
    tenant, _key = tenant_create(slug="bench", name="Bench")
    got = ingested(tenant, files, args.seed)
    candidates = targets(files)
    sample = rng.sample(candidates, min(args.queries, len(candidates)))
    log(f"{len(sample)} of {len(candidates)} documented functions sampled")
    rows, results, latencies = quality(tenant, got.chunks, sample)
    queries = [split_name(t.qualified) for t in sample] + [t.first_sentence for t in sample]
    met = results["name/mnemo"] >= 0.8 and results["docstring/mnemo"] > results["docstring/plain BM25"]
    head = machine_header(
        "bench/knowledge.py",
        f"corpus: Django {django_package.get_version()} ({', '.join(args.folders)}), "
        f"{len(files)} files, {len(got.chunks)} chunks; {len(sample)} functions, seed {args.seed}",
    )
    report = [
        head,
        render_table(["queries", "system", "MRR@10", "recall@10", "MRR vs plain BM25"], rows),
        ingest_table(files, got),
        latency_table(tenant, got, latencies, queries, args.grow),
        f"goal (name MRR@10 >= 0.8, docstring above plain BM25): {'met' if met else 'MISSED'}",
    ]
    return "\n\n".join(report), met
