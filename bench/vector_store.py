"""Vector search at the scale of a tenant's knowledge: the numpy backend (exact, the corpus held and scanned
in the web process) against Milvus Lite (HNSW), through retrieval.vectors' own stores, at each --sizes.

Vectors: sentences of this repository's docs and source files embedded with the local model (read at run
time), topped up to the size by synthetic vectors, each a real one mixed half and half with a random unit
vector and normalised, so they cluster as text does. Queries: other sentences of the same files, held out of
the corpus. The corpus is spread over TENANTS tenants; every search is filtered to one tenant.

Figures per size: recall@10 of Milvus against the exact top 10 of numpy (the baseline, same run), p50/p99
search latency, ingest rate, and resident memory (RSS) of the web process after serving queries of every
tenant. Each backend serves from its own fresh process; Milvus Lite runs as a server in a third process (a
Milvus server's place), so the web process holds only a client, and the engine's own RSS is shown apart.
Targets: recall@10 >= 0.98; at 1M, p50 <= 20 ms with the engine and a web process whose memory stays flat.

Milvus Lite (pure Python) walks every row of the searched segments in Python on each search, to keep the
newest version of each primary key and drop deleted ones, before its index is consulted: its latency grows
with the collection whatever the index, ef, filter or write batches. It shows recall and the web process's
memory; the latency target is a Milvus server's, measured with --uri milvus://host:port.

Run from the repository root: .venv/bin/python bench/vector_store.py [--sizes 100000,1000000] [--queries 200]
[--quick] [--uri milvus://host:port]
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import log, machine_header, percentile, render_table  # noqa: E402
from bench._django import django_setup, scratch_dir  # noqa: E402

TENANTS = 8
K = 10
DIMENSION = 384
SENTENCE = re.compile(r"[A-Z][^.!?\n]{30,300}[.!?]")


def sentences(limit: int) -> list[str]:
    """Distinct sentences of the docs and Python sources, in a fixed order."""
    seen: dict[str, None] = {}
    files = sorted([*ROOT.glob("docs/*.md"), *ROOT.glob("*/*.py"), *ROOT.glob("*/*/*.py")])
    for path in files:
        if ".venv" in path.parts or "migrations" in path.parts:
            continue
        for match in SENTENCE.finditer(path.read_text(errors="ignore")):
            seen.setdefault(" ".join(match.group().split()), None)
            if len(seen) >= limit:
                return list(seen)
    return list(seen)


def embed_sample(texts: list[str]) -> np.ndarray:
    from providers.embeddings import embedder_status

    embedder = embedder_status().embedder
    if embedder is None:
        raise SystemExit(f"No local embedding model: {embedder_status().reason}")
    out = []
    for start in range(0, len(texts), 64):
        out.append(np.asarray(embedder.embed(texts[start : start + 64]), dtype=np.float32))
        log(f"  embedded {min(start + 64, len(texts))}/{len(texts)}")
    return np.concatenate(out)


def corpus(real: np.ndarray, size: int, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty((size, DIMENSION), dtype=np.float32)
    head = min(len(real), size)
    out[:head] = real[:head]
    for start in range(head, size, 50_000):
        end = min(start + 50_000, size)
        noise = rng.standard_normal((end - start, DIMENSION)).astype(np.float32)
        noise /= np.linalg.norm(noise, axis=1, keepdims=True)
        mixed = real[rng.integers(0, len(real), end - start)] + noise
        out[start:end] = mixed / np.linalg.norm(mixed, axis=1, keepdims=True)
    return out


# --- processes ---------------------------------------------------------------------------------------------


def rss_mb(pid: str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def engine_main(path: str, pipe: Any) -> None:
    """A Milvus Lite server for one file, until told to stop."""
    from milvus_lite.server_manager import server_manager_instance

    pipe.send(server_manager_instance.start_and_get_uri(path))
    pipe.recv()


class _Rows:
    """The numpy store's loader over the corpus file: what the database rows are to it in production."""

    def __init__(self, path: str, tenants: np.ndarray) -> None:
        self.matrix = np.load(path, mmap_mode="r")
        self.tenants = tenants

    def load(self, kind: str, tenant_id: str, *, scopes: Any = None, owner: Any = None) -> Any:
        from retrieval.vectors.store import VectorRecord

        for i in np.flatnonzero(self.tenants == int(tenant_id)):
            yield VectorRecord("chunk", tenant_id, "tenant", str(i), np.array(self.matrix[i]))

    def count(self, kind: str) -> int:
        return len(self.tenants)


def web_main(
    backend: str, uri: str, corpus_path: str, tenants: np.ndarray, queries: np.ndarray, token: str = ""
) -> dict:
    """One web process: open the store, serve every query (a tenant each, in turn), report what it took."""
    from retrieval.vectors.milvus_store import MilvusVectorStore
    from retrieval.vectors.numpy_store import NumpyVectorStore
    from retrieval.vectors.store import VectorScope

    before = rss_mb()
    if backend == "numpy":
        store: Any = NumpyVectorStore(_Rows(corpus_path, tenants), dimension=DIMENSION, cache_seconds=1e9)
    else:
        store = MilvusVectorStore(uri, dimension=DIMENSION, token=token, prefix="bench", timeout=60.0)
    # The first query of each tenant loads (numpy) or warms (Milvus); timed apart from the rest.
    started = time.perf_counter()
    for tenant in range(TENANTS):
        store.search(VectorScope("chunk", str(tenant)), queries[0], k=K)
    warm = time.perf_counter() - started
    latencies, results = [], []
    for i, query in enumerate(queries):
        scope = VectorScope("chunk", str(i % TENANTS))
        started = time.perf_counter()
        hits = store.search(scope, query, k=K)
        latencies.append((time.perf_counter() - started) * 1000)
        results.append([h.id for h in hits])
    return {"warm": warm, "latencies": latencies, "results": results, "rss": rss_mb(), "rss_before": before}


def _wait_indexed(writer: Any, size: int, timeout: float = 3600.0) -> None:
    """Searches are measured on the built HNSW index, not on the interim one the engine serves while it
    builds (coarser: lower recall). Milvus Lite reports no build."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        try:
            indexed, total = writer.indexed("chunk")
        except Exception:  # Milvus Lite: no index build to wait for
            return
        if total and indexed >= total:
            log(f"[{size}] milvus: index built in {time.perf_counter() - started:.0f} s")
            return
        log(f"  indexed {indexed}/{total}")
        time.sleep(10)
    log(f"[{size}] milvus: index still building after {timeout:.0f} s; searching anyway")


def in_process(context: Any, target: Any, *args: Any) -> Any:
    with context.Pool(1) as pool:
        return pool.apply(target, args)


# --- one size ----------------------------------------------------------------------------------------------


class _Server:
    """A Milvus server given by --uri, in the place of the Milvus Lite process: not started or stopped here,
    its collection of this benchmark dropped before each size."""

    pid = None

    def __init__(self, uri: str, token: str) -> None:
        self.uri, self.token = uri, token


def run_size(size: int, real: np.ndarray, queries: np.ndarray, scratch: Path, server: _Server | None) -> dict:
    from retrieval.vectors.milvus_store import HNSW_EF_CONSTRUCTION, HNSW_M, MilvusVectorStore
    from retrieval.vectors.store import VectorRecord

    context = multiprocessing.get_context("spawn")
    matrix = corpus(real, size)
    tenants = np.arange(size) % TENANTS
    corpus_path = str(scratch / f"corpus-{size}.npy")
    np.save(corpus_path, matrix)
    log(f"[{size}] numpy: loading and searching in a fresh process")
    exact = in_process(context, web_main, "numpy", "", corpus_path, tenants, queries)

    parent, child = context.Pipe()
    if server is None:
        engine: Any = context.Process(target=engine_main, args=(str(scratch / f"vectors-{size}.db"), child))
        engine.start()
        uri, token = parent.recv(), ""
    else:
        engine, uri, token = server, server.uri, server.token
    try:
        log(f"[{size}] milvus: ingesting through {uri}")
        writer = MilvusVectorStore(uri, dimension=DIMENSION, token=token, prefix="bench", timeout=600.0)
        if server is not None:
            writer._connected().drop_collection(writer.collection("chunk"))
        started = time.perf_counter()
        for start in range(0, size, 5000):
            writer.add([
                VectorRecord("chunk", str(tenants[i]), "tenant", str(i), matrix[i])
                for i in range(start, min(start + 5000, size))
            ])  # fmt: skip
            if start % 100_000 == 0:
                log(f"  {start + 5000}/{size} in {time.perf_counter() - started:.0f} s")
        writer.flush("chunk")
        _wait_indexed(writer, size)
        count = writer.count("chunk")
        ingest = time.perf_counter() - started
        writer.close()
        del matrix
        log(f"[{size}] milvus: searching from a fresh process")
        engine_rss_before = rss_mb(str(engine.pid)) if engine.pid else float("nan")
        served = in_process(context, web_main, "milvus", uri, corpus_path, tenants, queries, token)
        engine_rss = max(engine_rss_before, rss_mb(str(engine.pid)) if engine.pid else float("nan"))
    finally:
        if server is None:
            parent.send("stop")
            engine.join(30)
            if engine.is_alive():
                engine.terminate()
    recall = np.mean(
        [
            len(set(a) & set(b)) / max(len(a), 1)
            for a, b in zip(exact["results"], served["results"], strict=True)
        ]
    )
    return {
        "size": size, "count": count, "exact": exact, "milvus": served, "ingest": size / ingest,
        "recall": float(recall), "engine_rss": engine_rss,
        "engine": "Milvus Lite HNSW" if server is None else "Milvus server HNSW",
        "hnsw": f"M={HNSW_M}, efConstruction={HNSW_EF_CONSTRUCTION}",
    }  # fmt: skip


def rows_of(result: dict) -> list[list[str]]:
    size, exact, served = result["size"], result["exact"], result["milvus"]
    p50 = percentile(exact["latencies"], 50), percentile(served["latencies"], 50)
    return [
        [f"{size:,}", "numpy (exact, baseline)", "1.000", f"{p50[0]:.1f}",
         f"{percentile(exact['latencies'], 99):.1f}", "-", f"{exact['warm']:.1f}", f"{exact['rss']:.0f}",
         "-"],
        [f"{size:,}", result["engine"], f"{result['recall']:.3f}", f"{p50[1]:.1f}",
         f"{percentile(served['latencies'], 99):.1f}", f"{result['ingest']:,.0f}", f"{served['warm']:.1f}",
         f"{served['rss']:.0f}", f"{result['engine_rss']:.0f}"],
        [f"{size:,}", "ratio Milvus / numpy", "", f"{p50[1] / p50[0]:.2f}", "", "", "",
         f"{served['rss'] / exact['rss']:.2f}", ""],
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100000,1000000", help="Corpus sizes, comma-separated")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--real", type=int, default=3000, help="Real sentences embedded for the corpus")
    parser.add_argument("--quick", action="store_true", help="One size of 10,000 (development)")
    parser.add_argument(
        "--uri",
        help="milvus://host:port: a Milvus server to measure instead of Milvus Lite (the latency target's)",
    )
    args = parser.parse_args()
    server = None
    if args.uri:
        from retrieval.vectors.config import parse_vector_store

        config = parse_vector_store(args.uri)
        if config.embedded:
            raise SystemExit("--uri names a Milvus server (milvus://host:port); Milvus Lite is the default.")
        server = _Server(config.uri, config.token)
    sizes = [10_000] if args.quick else [int(s) for s in args.sizes.split(",")]
    with scratch_dir("mnemo-bench-vectors-") as scratch:
        django_setup(var_dir=scratch)
        texts = sentences(args.real + args.queries)
        log(f"embedding {len(texts)} sentences of the repository's docs and sources")
        vectors = embed_sample(texts)
        queries, real = vectors[: args.queries], vectors[args.queries :]
        results = []
        for size in sizes:
            results.append(run_size(size, real, queries, scratch, server))
            log(render_table(HEAD, rows_of(results[-1])))
    from retrieval.vectors.milvus_store import SEARCH_EF

    print(machine_header(
        "bench/vector_store.py",
        f"corpus: {len(real)} sentences of this repository embedded with the local model, topped up by "
        "synthetic vectors (a real one mixed half and half with a random unit vector)",
        f"{args.queries} held-out sentences as queries, each filtered to one of {TENANTS} tenants; k={K}",
        (f"Milvus Lite {_version()} as a server in its own process" if server is None
         else f"the Milvus server at {server.uri}") + "; HNSW "
        f"{results[0]['hnsw'] if results else '-'}, search ef={SEARCH_EF}",
    ))  # fmt: skip
    print(render_table(HEAD, [row for result in results for row in rows_of(result)]))


HEAD = ["vectors", "backend", "recall@10", "p50 ms", "p99 ms", "ingest /s", "first queries s",
        "web RSS MB", "engine RSS MB"]  # fmt: skip


def _version() -> str:
    from importlib.metadata import version

    return version("milvus-lite")


if __name__ == "__main__":
    main()
