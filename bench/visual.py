"""Visual memory on a generated computer-use session, each figure against a baseline from the same run.

The session: 50 turns of 3–8 steps, one 1920×1080 UI-like screenshot per step drawn with Pillow (a window
with a sidebar, a form, a list and a status bar). Between steps the screen changes a little (typing, a
checkbox, a hover, a scroll), sometimes a lot (another page, a dialog), sometimes not at all (the same
frame again), and now and then an error dialog appears (the step's message is is_error). The generator knows
which frames truly differ from the previous one, so the hash's false duplicates can be counted.

Everything goes through the real services (message_append_batch, turn_start/turn_end, the context pipeline)
on an embedded SQLite database and file tiers in a temporary folder, removed at the end.

Figures: image tokens of the history after the 50 turns (gpt-4o rule) with no compaction and no dedup vs
Mnemo; frames stored with pixels; the dedup rate (vs exact sha256 dedup); false duplicates among frames that
truly changed; turn end with compaction vs a turn end without images; hashing on the reduced frame vs the
full frame (and how far apart the two hashes are); cold-tier read vs hot-tier read (sha256 check included).

Run from the repository root:  .venv/bin/python bench/visual.py   [--turns 50] [--seed 7] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/prefix_cache.py would shadow the
# prefix_cache app; the repository takes its place.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench._django import django_setup, scratch_dir  # noqa: E402
from bench._visual.report import header, table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="10 turns (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.turns = 10
    with scratch_dir("mnemo-bench-visual-") as var_dir:
        django_setup(var_dir=var_dir)
        # Imported here: the benchmark's modules import the apps, which needs django_setup() to have run.
        from bench._visual.measure import run

        result = run(args.turns, args.seed)
    print(header(args))
    print(
        f"# {result['frames']} frames ({result['distinct']} distinct screens, "
        f"{result['errors']} error dialogs); kept with pixels: each ended turn's first, last and error "
        "frames (and what a kept duplicate repeats)"
    )
    print(table(result))


if __name__ == "__main__":
    main()
