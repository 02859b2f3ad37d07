"""Where the evidence went that a context call missed: the diagnosis next to bench/evidence_recall.py's score.

On a load that bench/evidence_recall.py kept (--var-dir DIR --keep; the SQLite embedded server's var dir),
every question is asked again in this process, on a copy of the load (the kept one is not touched), through
the same pipeline the API runs (context_assemble, nothing recorded). ER is scored as evidence_recall.py
scores it, and each evidence message the prompt lacks is classed:

- ranked, not fitted: among B5's candidates (this conversation's message hits and their exchange partners,
  best first), but the budget ran out before it (its rank among them is reported);
- not a candidate: the retrieval never offered it (not ranked high enough, below the relevance floor).

So a change can be aimed: more room or cheaper items for the first kind, a better ranking for the second.
Also reported: the mean tokens of each block, i.e. where the budget went.

Run from the repository root, after a kept load:
  .venv/bin/python bench/evidence_recall.py --var-dir DIR --keep
  .venv/bin/python bench/evidence_misses.py --var-dir DIR [--budgets 2000,8000] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._common import machine_header  # noqa: E402
from bench._django import django_setup  # noqa: E402
from bench._evidence.dataset import DEFAULT_DATA, read_dataset  # noqa: E402
from bench._evidence.session import MANIFEST  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--var-dir", type=Path, required=True, help="a load evidence_recall.py kept")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--budgets", default="2000,8000")
    parser.add_argument("--json", type=Path, help="write per-question results here")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    manifest_path = args.var_dir / MANIFEST
    if not manifest_path.exists():
        sys.exit(f"{manifest_path} not found: load with bench/evidence_recall.py --var-dir DIR --keep first")
    manifest = json.loads(manifest_path.read_text())
    budgets = [int(b) for b in args.budgets.split(",")]
    dataset = read_dataset(args.data, None, None)
    with tempfile.TemporaryDirectory(prefix="mnemo-evidence-misses-") as scratch:
        copy = Path(scratch) / "var"
        shutil.copytree(args.var_dir, copy)
        django_setup(var_dir=copy)
        # Imported here: the benchmark's modules import the apps, which needs django_setup() to have run.
        from bench._evidence.misses import diagnose_all, report

        rows = diagnose_all(dataset, manifest, budgets)
    print(machine_header("bench/evidence_misses.py"))
    print(f"# load {args.var_dir}, data {args.data}; in-process context_assemble on a copy, nothing recorded")
    print(report(rows, budgets))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
