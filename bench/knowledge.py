"""Knowledge: code-search quality on real code no one here wrote, ingest speed and search latency.

Corpus: the Django package installed in the venv (its .py files under the chosen top-level folders, no
migrations or locales), uploaded as one tar.gz repository through the real services (tree-sitter chunks,
token counts, local embeddings) into a fresh SQLite database (or --pg, a throwaway PostgreSQL one).

Ground truth comes from Python's own `ast`, not from our chunker: --queries random functions and methods
with a docstring, each asked two ways:
- name: the qualified name split into words (`QuerySet.select_related` → "query set select related");
- docstring: the first sentence of its docstring.
A result is correct when it is the chunk of that very function (same path, its def line inside the chunk's
lines, same name). Reported: MRR@10 and recall@10 for Mnemo's search (BM25 over identifier-aware terms +
symbol trigrams + vectors, RRF), the same without vectors, and the baseline in the same run: plain BM25 over
the raw text of the same chunks (lower-cased \\w+ words, no splitting, no stemming).
Goal (issue #16): MRR@10 >= 0.8 on name queries and above the baseline on docstring queries.

Also: ingest (files/s of the repository; pages/s of a generated 200-page PDF), search latency p50/p95 over
the queries at the corpus size, and at 10k and 100k chunks (the index grown with copies of the corpus).

Run from the repository root:  .venv/bin/python bench/knowledge.py  (about 5 minutes on 2 cores; --quick:
django/db only and 100 queries). Exits 1 when the goal is missed."""

from __future__ import annotations

import argparse
import ast
import io
import math
import random
import re
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import log, machine_header, percentile, render_table
from bench._django import django_setup

# Django's top-level packages in the default corpus (--folders all: every one; embedding the chunks with the
# local model is most of the run's time).
FOLDERS = ["db", "http", "urls", "dispatch", "middleware"]


@dataclass(frozen=True)
class Target:
    path: str
    line: int  # the def line
    name: str
    qualified: str
    first_sentence: str


def corpus_files(root: Path, folders: list[str]) -> dict[str, bytes]:
    files = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root.parent).as_posix()
            if "/migrations/" in relative or "/locale/" in relative:
                continue
            files[relative] = path.read_bytes()
    return files


def targets(files: dict[str, bytes]) -> list[Target]:
    """Functions and methods (module or class level) with a docstring of at least four words."""
    found = []
    for path, data in files.items():
        try:
            tree = ast.parse(data)
        except SyntaxError:
            continue
        scopes = [(node, "") for node in tree.body]
        for node, prefix in scopes:
            if isinstance(node, ast.ClassDef):
                scopes += [(child, f"{prefix}{node.name}.") for child in node.body]
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name.startswith("__"):
                continue
            doc = ast.get_docstring(node) or ""
            sentence = re.split(r"(?<=\.)\s|\n\n", doc.strip(), maxsplit=1)[0].replace("\n", " ").strip()
            if len(sentence.split()) >= 4:
                found.append(Target(path, node.lineno, node.name, prefix + node.name, sentence))
    return found


def split_name(qualified: str) -> str:
    from knowledge.identifiers import symbol_words

    return symbol_words(qualified.replace(".", " "))


def tar_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


# --- the baseline: plain BM25 over raw chunk text ----------------------------------------------------------


class PlainBM25:
    def __init__(self, texts: list[str]) -> None:
        self.docs = [Counter(re.findall(r"\w+", t.lower())) for t in texts]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.average = sum(self.lengths) / max(1, len(self.lengths))
        self.df = Counter(term for d in self.docs for term in d)
        self.postings: dict[str, list[int]] = {}
        for i, d in enumerate(self.docs):
            for term in d:
                self.postings.setdefault(term, []).append(i)

    def top(self, query: str, k: int = 10) -> list[int]:
        n, scores = len(self.docs), Counter()
        for term in set(re.findall(r"\w+", query.lower())):
            idf = math.log(1 + (n - self.df[term] + 0.5) / (self.df[term] + 0.5))
            for i in self.postings.get(term, []):
                tf = self.docs[i][term]
                scores[i] += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * self.lengths[i] / self.average))
        return [i for i, _ in scores.most_common(k)]


# --- measuring ---------------------------------------------------------------------------------------------


def correct(chunk, target: Target) -> bool:
    return (
        chunk.path == target.path
        and chunk.start_line <= target.line <= chunk.end_line
        and chunk.symbol.split(".")[-1] == target.name
    )


def scores(ranks: list[int | None]) -> tuple[float, float]:
    """(MRR@10, recall@10) of first-correct ranks (None: not in the top 10)."""
    mrr = sum(1 / r for r in ranks if r) / len(ranks)
    return mrr, sum(1 for r in ranks if r) / len(ranks)


def first_rank(chunks, target: Target) -> int | None:
    return next((i + 1 for i, c in enumerate(chunks[:10]) if correct(c, target)), None)


def ingest_repository(tenant, files: dict[str, bytes]) -> tuple[str, float]:
    from django.core.files.uploadedfile import SimpleUploadedFile

    from knowledge.services import Scope, document_process, documents_upload

    upload = SimpleUploadedFile("django.tar.gz", tar_of(files))
    started = time.perf_counter()
    # Outside a transaction the processing queued on commit runs inside the upload call (eager tasks).
    [uploaded] = documents_upload(tenant=tenant, files=[upload], scope=Scope())
    document = document_process(document_id=uploaded.document.pk) or uploaded.document
    document.refresh_from_db()
    elapsed = time.perf_counter() - started
    assert document is not None and document.status == "ready", document and document.error
    return str(document.pk), elapsed


def parse_only(files: dict[str, bytes]) -> float:
    """Seconds to read and chunk the repository without embedding or storing it."""
    from knowledge.conf import knowledge_limits
    from knowledge.ingest import ingest

    started = time.perf_counter()
    ingest(name="django.tar.gz", format_name="archive", data=tar_of(files), limits=knowledge_limits())
    return time.perf_counter() - started


def parse_only_pdf(pdf: bytes) -> float:
    from knowledge.conf import knowledge_limits
    from knowledge.ingest import ingest

    started = time.perf_counter()
    ingest(name="gen.pdf", format_name="pdf", data=pdf, limits=knowledge_limits())
    return time.perf_counter() - started


def pdf_pages(count: int, rng: random.Random) -> bytes:
    words = ["invoice", "ledger", "refund", "policy", "customer", "account", "retention", "backup", "audit"]
    pages = [[" ".join(rng.choice(words) for _ in range(14)) for _ in range(18)] for _ in range(count)]
    from tests.knowledge.files import pdf_bytes  # the tests' exact PDF writer

    return pdf_bytes(pages)


def quality(tenant, chunks, sample: list[Target]) -> tuple[list[list[str]], dict[str, float], list[float]]:
    """Rows of the quality table; the fused ranking is also computed with the vector ranking of code chunks
    weighing 0, 0.5 and 1 (from the same query vectors), to show what the local model adds on code."""
    from knowledge import search as knowledge_search_module
    from knowledge.search import knowledge_index, knowledge_search, search
    from providers.embeddings import embed_query

    baseline = PlainBM25([c.content for c in chunks])
    index = knowledge_index(tenant.pk)
    default = knowledge_search_module.CODE_VECTOR_WEIGHT
    weights = sorted({default, 1.0, 0.5, 0.0}, reverse=True)
    rows, results, latencies = [], {}, []
    kinds = (("name", lambda t: split_name(t.qualified)), ("docstring", lambda t: t.first_sentence))
    for kind, make_query in kinds:
        ranks: dict[str, list[int | None]] = {}
        for target in sample:
            query = make_query(target)
            started = time.perf_counter()
            knowledge_search(tenant_id=tenant.pk, query=query, limit=10)
            latencies.append((time.perf_counter() - started) * 1000)
            vector, _model = embed_query(query)
            for weight in weights:
                knowledge_search_module.CODE_VECTOR_WEIGHT = weight
                hits = search(index, query=query, query_vector=vector, scope_keys={"tenant"}, limit=10)
                label = f"mnemo, vectors ×{weight:g}" + (" (default)" if weight == default else "")
                ranks.setdefault(label, []).append(first_rank([h.chunk for h in hits], target))
            knowledge_search_module.CODE_VECTOR_WEIGHT = default
            top = [chunks[i] for i in baseline.top(query)]
            ranks.setdefault("plain BM25", []).append(first_rank(top, target))
        base_mrr = scores(ranks["plain BM25"])[0]
        for system, found in ranks.items():
            mrr, recall = scores(found)
            results[f"{kind}/{'mnemo' if '(default)' in system else system}"] = mrr
            ratio = f"{mrr / base_mrr:.2f}×" if base_mrr else "–"
            rows.append([kind, system, f"{mrr:.3f}", f"{recall:.3f}", ratio])
    return rows, results, latencies


def grown_latency(tenant, queries: list[str], size: int) -> tuple[float, float]:
    """Search latency once the tenant's index holds `size` chunks (copies of the corpus's rows)."""
    from knowledge.models import Chunk
    from knowledge.search import knowledge_index, knowledge_search

    index = knowledge_index(tenant.pk)
    rows = list(
        Chunk.objects.filter(tenant=tenant).values_list(
            "id", "document_id", "scope_key", "kind", "path", "symbol", "heading", "content", "embedding",
            "embedding_model",
        )
    )  # fmt: skip
    while len(index) < size:
        for row in rows[: size - len(index)]:
            index._add(*row)
    knowledge_search(tenant_id=tenant.pk, query="warm up", limit=10)
    latencies = []
    for query in queries:
        started = time.perf_counter()
        knowledge_search(tenant_id=tenant.pk, query=query, limit=10)
        latencies.append((time.perf_counter() - started) * 1000)
    return percentile(latencies, 50), percentile(latencies, 95)


def ingest_row(label: str, amount: str, count: int, seconds: float) -> list[str]:
    unit = "files/s" if "files" in amount else "pages/s"
    return [label, amount, f"{seconds:.1f}", f"{count / seconds:.1f} {unit}"]


def run(args: argparse.Namespace) -> tuple[str, bool]:
    import django as django_package

    rng = random.Random(args.seed)
    root = Path(django_package.__file__).parent
    files = corpus_files(root, args.folders)
    log(f"corpus: {len(files)} files of Django {django_package.get_version()}")

    from knowledge.models import Chunk
    from tenants.services import tenant_create

    tenant, _key = tenant_create(slug="bench", name="Bench")
    document_id, seconds = ingest_repository(tenant, files)
    chunks = list(Chunk.objects.filter(document_id=document_id).defer("embedding").order_by("ordinal"))
    embedded = Chunk.objects.filter(document_id=document_id, embedding__isnull=False).count()
    log(f"ingested {len(files)} files, {len(chunks)} chunks ({embedded} with vectors) in {seconds:.1f} s")

    parse_files = parse_only(files)
    pdf = pdf_pages(200, random.Random(args.seed))
    parse_pdf = parse_only_pdf(pdf)
    from django.core.files.uploadedfile import SimpleUploadedFile

    from knowledge.services import Scope, document_process, documents_upload

    started = time.perf_counter()
    [pdf_doc] = documents_upload(tenant=tenant, files=[SimpleUploadedFile("gen.pdf", pdf)], scope=Scope())
    document_process(document_id=pdf_doc.document.pk)
    pdf_seconds = time.perf_counter() - started
    pdf_doc.document.refresh_from_db()
    assert pdf_doc.document.status == "ready" and pdf_doc.document.details["pages"] == 200

    candidates = targets(files)
    sample = rng.sample(candidates, min(args.queries, len(candidates)))
    log(f"{len(sample)} of {len(candidates)} documented functions sampled")
    rows, results, latencies = quality(tenant, chunks, sample)
    queries = [split_name(t.qualified) for t in sample] + [t.first_sentence for t in sample]
    latency_rows = [
        [
            f"{len(chunks) + 0:,} (corpus)",
            f"{percentile(latencies, 50):.1f}",
            f"{percentile(latencies, 95):.1f}",
        ]
    ]
    for size in args.grow:
        p50, p95 = grown_latency(tenant, queries[:100], size)
        latency_rows.append([f"{size:,}", f"{p50:.1f}", f"{p95:.1f}"])

    met = results["name/mnemo"] >= 0.8 and results["docstring/mnemo"] > results["docstring/plain BM25"]
    folders = ", ".join(args.folders)
    report = "\n\n".join(
        [
            machine_header(
                "bench/knowledge.py",
                f"corpus: Django {django_package.get_version()} ({folders}), "
                f"{len(files)} files, {len(chunks)} chunks; {len(sample)} functions, seed {args.seed}",
            ),
            render_table(["queries", "system", "MRR@10", "recall@10", "MRR vs plain BM25"], rows),
            render_table(
                ["ingest", "amount", "seconds", "rate"],
                [
                    ingest_row(
                        "repository: read, chunk, count tokens",
                        f"{len(files)} files",
                        len(files),
                        parse_files,
                    ),
                    ingest_row(
                        "repository: + vectors, rows (the real path)",
                        f"{len(files)} files",
                        len(files),
                        seconds,
                    ),
                    ingest_row("generated PDF: read, chunk, count tokens", "200 pages", 200, parse_pdf),
                    ingest_row(
                        "generated PDF: + vectors, rows (the real path)", "200 pages", 200, pdf_seconds
                    ),
                ],
            ),
            render_table(["chunks in the index", "search p50 ms", "search p95 ms"], latency_rows),
            f"goal (name MRR@10 >= 0.8, docstring above plain BM25): {'met' if met else 'MISSED'}",
        ]
    )
    return report, met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="django/db only, 100 queries, no growth")
    parser.add_argument("--folders", nargs="*", default=FOLDERS, help="Django packages to index ('all')")
    parser.add_argument("--grow", type=int, nargs="*", default=[10_000, 100_000], help="index sizes to time")
    parser.add_argument("--pg-url", default="", help="a PostgreSQL database URL to use instead of SQLite")
    args = parser.parse_args()
    if args.quick:
        args.queries, args.grow, args.folders = min(args.queries, 100), [], ["db"]
    if args.folders == ["all"]:
        import django as django_package

        root = Path(django_package.__file__).parent
        args.folders = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_"))
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-knowledge-") as var_dir:
        django_setup(var_dir=Path(var_dir), database_url=args.pg_url)
        report, met = run(args)
    print(report)
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
