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
Goal: MRR@10 >= 0.8 on name queries and above the baseline on docstring queries.

Also: ingest (files/s of the repository; pages/s of a generated 200-page PDF), search latency p50/p95 over
the queries at the corpus size, and at 10k and 100k chunks (the index grown with copies of the corpus).

Run from the repository root:  .venv/bin/python bench/knowledge.py  (about 5 minutes on 2 cores; --quick:
django/db only and 100 queries). Exits 1 when the goal is missed."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import django as django_package

# Run as a script, Python puts bench/ first on sys.path, where this very file would shadow the knowledge app;
# the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._django import django_setup  # noqa: E402

# Django's top-level packages in the default corpus (--folders all: every one; embedding the chunks with the
# local model is most of the run's time).
FOLDERS = ["db", "http", "urls", "dispatch", "middleware"]


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
        root = Path(django_package.__file__).parent
        args.folders = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("_"))
    with tempfile.TemporaryDirectory(prefix="mnemo-bench-knowledge-") as var_dir:
        django_setup(var_dir=Path(var_dir), database_url=args.pg_url)
        # Imported here: the benchmark's modules import the apps, which needs django_setup() to have run.
        from bench._knowledge.run import run

        report, met = run(args)
    print(report)
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
