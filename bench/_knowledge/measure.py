"""What the knowledge benchmark measures: ingest rates, search quality against plain BM25, search latency as
the index grows."""

from __future__ import annotations

import math
import re
import time
from collections import Counter

from django.core.files.uploadedfile import SimpleUploadedFile

from bench._common import percentile
from bench._knowledge.corpus import Target, split_name, tar_of
from knowledge.conf import knowledge_limits
from knowledge.ingest import ingest
from knowledge.models import Chunk
from knowledge.processing import document_process
from knowledge.services import Scope, documents_upload
from providers.embeddings import embed_query
from retrieval import knowledge as knowledge_search_module
from retrieval.knowledge import knowledge_index, knowledge_search, search


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
    started = time.perf_counter()
    ingest(name="django.tar.gz", format_name="archive", data=tar_of(files), limits=knowledge_limits())
    return time.perf_counter() - started


def parse_only_pdf(pdf: bytes) -> float:
    started = time.perf_counter()
    ingest(name="gen.pdf", format_name="pdf", data=pdf, limits=knowledge_limits())
    return time.perf_counter() - started


def quality(tenant, chunks, sample: list[Target]) -> tuple[list[list[str]], dict[str, float], list[float]]:
    """Rows of the quality table; the fused ranking is also computed with the vector ranking of code chunks
    weighing 0, 0.5 and 1 (from the same query vectors), to show what the local model adds on code."""
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
