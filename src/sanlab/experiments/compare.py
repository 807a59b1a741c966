"""``sanlab compare``: run a grid of variants x seeds and print the papers' comparison table.

The command (``run_compare``: list, run, re-score the cells, then write and print the table) and ``--rescore``.
The table's rows, significance tests and legend are built in ``compare_report``, rendered in ``tables``;
the cells are run by ``running`` and ``cells``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from sanlab.errors import ConfigError, DataError
from sanlab.experiments.cells import CellOutcome, check_synthetic, rescore_tagging_cell
from sanlab.experiments.compare_report import (  # noqa: F401  (build_section, majority_mark, paired_test re-exported)
    build_report,
    build_section,
    majority_mark,
    mismatched_finished_cells,
    paired_test,
)
from sanlab.experiments.grid import load_grid
from sanlab.experiments.grid_schema import Cell, Grid
from sanlab.experiments.importing import import_cells
from sanlab.experiments.running import describe_cells, run_grid, run_order, select_cells  # noqa: F401  (re-exported)
from sanlab.experiments.tables import render_markdown, write_report
from sanlab.invocation import command_line
from sanlab.training.stop_after import StopAfter


def rescore_cells(grid: Grid, cells: Sequence[Cell], *, log: Callable[[str], None]) -> list[str]:
    """``--rescore``: score the chosen tagging cells that were evaluated again from their predictions
    (``cells.rescore_tagging_cell``); trains and runs no model. Returns the errors, one per failed cell."""
    from sanlab.runs import run_lock

    grid.kind.require("rescore", grid.path, what="grid", spelt="sanlab compare --rescore")
    errors = []
    for cell in cells:
        if not cell.layout.compare_eval.exists():
            log(f"{cell.label}: not scored yet, nothing to re-score")
            continue
        try:
            with run_lock(cell.run_dir):  # a grid run may be scoring it
                old, new = rescore_tagging_cell(cell, grid.spec.eval)
        except (ConfigError, DataError) as err:  # (a damaged or changed file): the other cells go on
            errors.append(f"{cell.label}: {err}")
            log(f"{cell.label}: NOT re-scored: {err}")
            continue
        changes = [f"{col} {_group_score(old, key)} -> {_group_score(new, key)}" for col, key in grid.kind.metrics
                   if _group_score(old, key) != _group_score(new, key)]
        log(f"{cell.label}: re-scored: " + ("; ".join(changes) if changes else "unchanged"))
    return errors


def _group_score(scores: dict, key: str) -> str:
    """``"48.29 (642 tokens)"``: a word group's accuracy and size in an evaluation record."""
    value = scores.get(key)
    return "—" if value is None else f"{value:.2f} ({scores.get(f'n_{key}')} tokens)"


def _refuse_conflicting_modes(*, jobs: int, dry_run: bool, table_only: bool, rescore: bool, selected: bool) -> None:
    """The flags of ``sanlab compare`` that do not go together (``selected``: --only, --dataset or --seed)."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    modes = [flag for flag, on in (("--dry-run", dry_run), ("--table-only", table_only), ("--rescore", rescore)) if on]
    if len(modes) > 1:
        raise ConfigError(f"{' and '.join(modes)}: choose one (--dry-run lists the cells, --table-only prints the "
                          "table, --rescore scores the cells again from their predictions and prints the table)")
    if table_only and selected:
        # the table always shows every cell; ignoring a selection would look like it had been applied
        raise ConfigError("--table-only prints the whole table; --only, --dataset and --seed choose the cells "
                          "to run: drop them")


def left_by_the_limit(left: Sequence[CellOutcome], stop_after: StopAfter, *, named: int = 10) -> str:
    """The closing line of an invocation whose --stop-after limit left cells unfinished: how many, and which (the
    first ``named``; each one's own line above says what it was left as)."""
    labels = [o.cell.label for o in left]
    more = f" and {len(labels) - named} more (their lines above)" if len(labels) > named else ""
    return (f"NOT FINISHED: {len(labels)} cell(s) left by --stop-after {stop_after.text}, resumable (run the same "
            f"command again): {', '.join(labels[:named])}{more}")


def run_compare(path: str, *, overrides: Sequence[str] = (), runs_dir: str | None = None, dry_run: bool = False,
                table_only: bool = False, rescore: bool = False, jobs: int = 1, only: Sequence[str] = (),
                datasets: Sequence[str] = (), seeds: Sequence[int] = (), datasets_file: str | None = None,
                quiet: bool = False, command: str | None = None, out: Callable[[str], None] = print,
                imports: Sequence[str] = (), stop_after: StopAfter | None = None) -> int:
    """What ``sanlab compare`` does; returns the exit code (1 if a cell failed, or one of ``imports``' cells
    was not imported). ``datasets_file`` (``--datasets``) replaces the grid's datasets (``grid.load_grid``);
    ``imports`` (``--import``): archives of cells trained elsewhere (``importing``), then the table only.
    ``stop_after`` (``--stop-after``): the invocation's wall-time limit (``running.run_grid``); cells it cut are
    resumable, not failed."""
    if imports and (table_only or dry_run or rescore):
        raise ConfigError("--import adds cells and prints the table: drop --table-only, --dry-run and --rescore")
    if imports and (only or datasets or seeds):
        raise ConfigError("--import brings in every cell of the archive and prints the whole table; --only, "
                          "--dataset and --seed choose the cells to run: drop them")
    if stop_after is not None and (imports or table_only or rescore or dry_run):  # none of them trains
        flag = next(f for f, on in (("--import", imports), ("--table-only", table_only), ("--rescore", rescore),
                                    ("--dry-run", dry_run)) if on)
        raise ConfigError(f"--stop-after with {flag}, which trains no cell: drop --stop-after")
    if jobs > 1 and (imports or table_only or rescore or dry_run):  # none of them trains: --jobs would do nothing
        flag = next(f for f, on in (("--import", imports), ("--table-only", table_only), ("--rescore", rescore),
                                    ("--dry-run", dry_run)) if on)
        raise ConfigError(f"--jobs {jobs} with {flag}, which trains no cell: drop --jobs")
    _refuse_conflicting_modes(jobs=jobs, dry_run=dry_run, table_only=table_only, rescore=rescore,
                              selected=bool(only or datasets or seeds))
    grid = load_grid(path, overrides=list(overrides), runs_dir=runs_dir, datasets_file=datasets_file)
    check_synthetic(grid)
    cells = select_cells(grid, only=only, datasets=datasets, seeds=seeds)
    if dry_run:
        out(describe_cells(grid, cells))
        return 0
    command = command or command_line()
    errors = [f"NOT RE-SCORED {e}" for e in rescore_cells(grid, cells, log=lambda m: print(m, file=sys.stderr))] \
        if rescore else []
    for archive in imports:
        errors += [f"NOT IMPORTED {i.cell.label} from {archive}: {i.error}"
                   for i in import_cells(grid, archive, log=lambda m: print(m, file=sys.stderr)) if i.error]

    def write_table() -> None:
        # a finished cell that does not match this invocation's settings would drop out of the table:
        # the committed table is then left as it is (checked before every write)
        if not mismatched_finished_cells(grid):
            write_report(build_report(grid, command=command), grid.runs_dir)

    outcomes = []
    if not table_only and not rescore and not imports:
        # the table on disk is rewritten after every cell, so a grid stopped partway leaves a partial table
        outcomes = run_grid(grid, cells, jobs=jobs, quiet=quiet, log=lambda m: print(m, file=sys.stderr),
                            keep_order=bool(only), after_cell=lambda _: write_table(), stop_after=stop_after)
    failed = [o for o in outcomes if o.error]
    left = [o for o in outcomes if o.stopped and not o.error]
    try:
        report = build_report(grid, command=command)
        out(render_markdown(report))
        left_out = mismatched_finished_cells(grid)
        if left_out:
            # almost always a forgotten or extra --set
            out(f"NOT written to {grid.runs_dir}: {len(left_out)} finished cell(s) do not match this invocation's "
                "settings and are missing from the table above (pass the --set they were trained with; or, if the "
                "new settings are meant, run the grid until those cells are trained and scored again; a conflict "
                "says what it needs):")
            out("\n".join(f"  {cell.label}: {state.describe()}" for cell, state in left_out))
            return 1
        paths = write_report(report, grid.runs_dir)
        out(f"(written to {paths['md']}, {paths['csv'].name}, {paths['json'].name})")
    finally:
        for o in failed:
            out(f"FAILED {o.cell.label}: {o.error}")
        for error in errors:
            out(error)
        if left:  # not failures (exit 0), but the table above is of an unfinished grid: said last, as they are
            out(left_by_the_limit(left, stop_after))
    return 1 if failed or errors else 0
