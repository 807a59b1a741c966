"""Rerun the analyses of `results/csan-multi30k.md` over every evaluated cell of the CSAN Table 1 grid, so that
a cell that lands joins them with one command (issue 26: "the n-gram gap, length buckets and pairwise analyses
rerun with the new rows").

    python scripts/csan_multi30k_analyses.py [--dry-run] [--runs-dir DIR]

From the repository root's grid (`configs/compare/csan-table1-multi30k.yaml`) and the cells in its runs
directory that are evaluated as the grid asks, in the grid's row order (seeds of a row together):

1. `sanlab evaluate --run CELL --split valid` (beam 5) for each cell, of any row, without dev hypotheses
   (`hyp-best-valid.txt`) whose checkpoints are on this machine (`scripts/csan_multi30k_tables.py` needs every
   cell's, for the write-up's dev columns); a committed cell has its dev hypotheses already, and one without them
   or its checkpoints is left out of the dev-set analyses with a line saying so.
2. `sanlab analyze ngram-gap` (CSAN Fig. 3, dev set): vanilla's other seeds and every CSAN Table 1 row
   against vanilla seed 1 (the other papers' rows are not locality models: not in CSAN's figure);
3. `sanlab analyze length-buckets` (MUSE Fig. 3, test): every run against vanilla seed 1;
4. `sanlab analyze pairwise` (test): every run against every vanilla seed.

Outputs: `results/csan-multi30k-{ngram-gap,length-buckets,pairwise}.{md,csv,png}`. `--dry-run` prints the
commands and runs nothing. The analyses read only hypothesis files and the data, so steps 2-4 run on a fresh
clone with `../shared/data` present.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from csan_multi30k_rows import TABLE1  # CSAN's Table 1 rows (the n-gram gap's runs); the others are other papers'

ROOT = Path(__file__).resolve().parents[1]
GRID = Path("configs/compare/csan-table1-multi30k.yaml")
OUT = Path("results")
BASELINE = "vanilla"
LENGTH_BUCKETS = "8,10,12,15"  # Multi30k-sized: source sentences run from 4 to 32 words
# Committed cells whose dev hypotheses can no longer be made, and why: they are left out of the n-gram gap and
# the tables' dev columns say so. Anything else without dev hypotheses or checkpoints is an omission to fix.
DEV_HYPOTHESES_LOST = {
    ("Neighbor", 3): "its checkpoints went with the machine of the session that trained it (2026-11-28), which was "
                     "shut down before the dev set was decoded; its test hypotheses and scores are committed",
}


def evaluated_cells(grid) -> list:
    """The grid's evaluated cells, in row order with a row's seeds together."""
    from sanlab.experiments.grid_state import cell_state

    done = [c for c in grid.cells if cell_state(c, grid.spec.eval).status == "evaluated"]
    order = [v.name for v in grid.spec.variants]
    return sorted(done, key=lambda c: (order.index(c.variant), c.seed))


def has_dev_hypotheses(cell) -> bool:
    return cell.layout.hypotheses("best", "valid").is_file()


def has_checkpoints(cell) -> bool:
    return cell.layout.checkpoints.is_dir() and any(cell.layout.checkpoints.glob("step-*"))


def plan(cells: list) -> tuple[list[list[str]], list[str]]:
    """(sanlab command lines in the order to run them, lines about cells left out of an analysis)."""
    baselines = [c for c in cells if c.variant == BASELINE]
    if not baselines or baselines[0].seed != 1:
        raise SystemExit(f"{GRID}: vanilla seed 1 is not evaluated yet: it is every analysis' baseline")
    base, others = baselines[0], [c for c in cells if c is not baselines[0]]
    commands, notes = [], []
    dev = []  # every cell with dev hypotheses, once step 1 has run
    for cell in cells:
        left_out = "the n-gram gap and the write-up's dev columns" if cell.variant in (BASELINE, *TABLE1) \
            else "the write-up's dev columns"
        if has_dev_hypotheses(cell):
            dev.append(cell)
        elif has_checkpoints(cell):
            commands.append(["evaluate", "--run", str(cell.run_dir), "--split", "valid"])
            dev.append(cell)
        elif (cell.variant, cell.seed) in DEV_HYPOTHESES_LOST:
            notes.append(f"{cell.run_dir}: no hyp-best-valid.txt, left out of {left_out}: "
                         f"{DEV_HYPOTHESES_LOST[cell.variant, cell.seed]}")
        else:
            notes.append(f"{cell.run_dir}: no hyp-best-valid.txt and no checkpoints here: left out of {left_out} "
                         f"(its dev hypotheses come from the machine that trained it: `sanlab evaluate --run "
                         f"{cell.run_dir} --split valid` there)")
    dev = [c for c in dev if c.variant in (BASELINE, *TABLE1)]  # CSAN Fig. 3 is about its Table 1's rows
    if base in dev:
        commands.append(["analyze", "ngram-gap", *(str(c.run_dir) for c in dev if c is not base),
                         "--baseline", str(base.run_dir), "--split", "valid", "--out", str(OUT / "csan-multi30k-ngram-gap")])
    else:
        notes.append(f"{base.run_dir}: no dev hypotheses: no n-gram gap")
    commands.append(["analyze", "length-buckets", *(str(c.run_dir) for c in others), "--baseline", str(base.run_dir),
                     "--buckets", LENGTH_BUCKETS, "--out", str(OUT / "csan-multi30k-length-buckets")])
    commands.append(["analyze", "pairwise", *(str(c.run_dir) for c in cells), "--against",
                     *(str(c.run_dir) for c in baselines), "--out", str(OUT / "csan-multi30k-pairwise")])
    return commands, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--runs-dir", type=Path, help="the grid's cells elsewhere than its runs_dir")
    args = parser.parse_args(argv)
    runs_dir = args.runs_dir.resolve() if args.runs_dir else None  # relative to where it was typed
    os.chdir(ROOT)  # the grid's data paths are relative to the repository root
    from sanlab.experiments.grid import load_grid
    commands, notes = plan(evaluated_cells(load_grid(GRID, runs_dir=runs_dir)))
    for note in notes:
        print(note, file=sys.stderr)
    from sanlab.cli import main as sanlab
    for command in commands:
        print("sanlab " + shlex.join(command), flush=True)
        if not args.dry_run and (status := sanlab(command)) != 0:
            return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
