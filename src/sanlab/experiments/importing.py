"""Cells trained on another machine join a grid: ``sanlab compare GRID --import ARCHIVE``.

``scripts/gpu_check.sh``'s table1 step brings back the small files of the cells it finished and scored as a
``.tar.gz`` (the files ``results/compare/.gitignore`` tracks: no checkpoints). Unpacked by hand, such an
archive can write into a cell that this machine's own queue began meanwhile: that training then goes on among
another run's files (it happened on 2026-11-27). Here each cell of the archive is checked first and lands whole
or not at all:

- only finished, scored cells of this grid (``config.yaml``, ``done.json`` and ``compare-eval.json`` in the
  archive), as plain files directly in the cell's directory, under a path that ends in the grid's runs directory;
  one copy of each (one directory, each name once) and no hidden names (``.lock``); the archive is read through
  before anything lands, so one cut short or damaged imports nothing;
- a cell that exists here with a ``config.yaml`` (begun or finished on this machine) is left alone, and so is one
  whose run lock another process holds;
- the files are extracted beside the cell and renamed into place under the cell's run lock, ``done.json`` and
  then ``compare-eval.json`` last (they mark the cell finished and scored); a cell that is then not
  ``evaluated`` as the grid asks (trained with other settings) is taken out again.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sanlab.errors import ConfigError
from sanlab.experiments.grid_schema import Cell, Grid
from sanlab.experiments.grid_state import FAILED_FILE, cell_state
from sanlab.training.rundir import entries, is_known

REQUIRED = ("config.yaml", "done.json", "compare-eval.json")
LAST = ("done.json", "compare-eval.json")  # renamed into place last, in this order


@dataclass(frozen=True)
class Imported:
    cell: Cell
    error: str | None = None  # why it was not imported; None: imported


def import_cells(grid: Grid, archive: str | os.PathLike[str], *, log: Callable[[str], None]) -> list[Imported]:
    """Import every cell of ``archive`` that may join ``grid`` (module docstring); one ``Imported`` per cell found.
    Members that belong to no cell of the grid are an error (a ConfigError naming them), before anything lands."""
    path = Path(archive)
    try:
        with tarfile.open(path, "r:*") as tar:
            members = tar.getmembers()
            by_cell = _members_by_cell(grid, members, path)
            for member in members:  # read through once: a truncated or damaged archive stops before any cell lands
                if member.isfile():
                    with tar.extractfile(member) as f:
                        while f.read(1 << 20):
                            pass
            outcomes = []
            for cell, files in by_cell.values():
                error = _import_one(grid, cell, files, tar)
                outcomes.append(Imported(cell, error))
                log(f"{cell.label}: " + ("imported" if error is None else f"NOT imported: {error}"))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:  # EOFError: cut short (gzip, bz2, xz)
        raise ConfigError(f"{path}: cannot read the archive ({type(err).__name__}: {err}); nothing was imported "
                          "from it") from None
    if not outcomes:
        log(f"{path}: no cell of this grid in the archive")
    return outcomes


def _members_by_cell(grid: Grid, members: list[tarfile.TarInfo],
                     archive: Path) -> dict[Path, tuple[Cell, list[tarfile.TarInfo]]]:
    """The archive's files grouped by the grid's cell they belong to (keyed by its run directory); directories
    are skipped."""
    cells = {c.run_dir.relative_to(grid.runs_dir).parts: c for c in grid.cells}
    grid_dir = grid.runs_dir.name
    by_cell: dict[Path, tuple[Cell, list[tarfile.TarInfo]]] = {}
    strays = []
    for m in members:
        if m.isdir():
            continue
        parts = PurePosixPath(m.name).parts
        cell = next((cells[rel] for rel in cells if _ends_with_cell(parts, rel, grid_dir)), None)
        # a hidden name (.lock: the cell's run lock here) is never a result file
        if cell is None or not m.isfile() or m.name.startswith("/") or ".." in parts or parts[-1].startswith("."):
            strays.append(m.name)
            continue
        by_cell.setdefault(cell.run_dir, (cell, []))[1].append(m)
    if strays:
        shown = ", ".join(strays[:5]) + (f" and {len(strays) - 5} more" if len(strays) > 5 else "")
        raise ConfigError(f"{archive}: not files of cells of {grid.path} (…/{grid_dir}/<variant>/seed-<N>/<file>): "
                          f"{shown}; nothing was imported")
    copies = [_copies(cell, files) for cell, files in by_cell.values()]
    if any(copies):
        raise ConfigError(f"{archive}: {'; '.join(c for c in copies if c)}: which one is meant cannot be told; "
                          "nothing was imported")
    return by_cell


def _copies(cell: Cell, files: list[tarfile.TarInfo]) -> str:
    """Why the archive does not hold exactly one copy of ``cell`` (files under two directories, or a name twice),
    or "": mixing the files of two copies would make a cell that was never trained."""
    dirs = sorted({str(PurePosixPath(m.name).parent) for m in files})
    if len(dirs) > 1:
        return f"{cell.label} is there {len(dirs)} times ({', '.join(dirs)})"
    names = [PurePosixPath(m.name).name for m in files]
    twice = sorted({n for n in names if names.count(n) > 1})
    return f"{cell.label} has {', '.join(twice)} more than once" if twice else ""


def _ends_with_cell(parts: tuple[str, ...], rel: tuple[str, ...], grid_dir: str) -> bool:
    """``parts`` is ``…/<grid_dir>/<rel…>/<file>``."""
    n = len(rel)
    return len(parts) >= n + 2 and parts[-n - 1:-1] == rel and parts[-n - 2] == grid_dir


def _import_one(grid: Grid, cell: Cell, files: list[tarfile.TarInfo], tar: tarfile.TarFile) -> str | None:
    from sanlab.runs import run_lock

    names = {PurePosixPath(m.name).name: m for m in files}
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        return f"the archive lacks {', '.join(missing)} (only finished, scored cells are imported)"
    if cell.layout.config.exists():
        return (f"{cell.run_dir} exists here (begun or finished on this machine); to replace it with the archive's, "
                "move it away first")
    unknown = sorted(n for n in names if not is_known(n))
    if unknown:  # (a name sanlab never writes in a run directory: not a cell's file)
        return f"the archive holds files no run writes ({', '.join(unknown[:5])})"
    try:
        with run_lock(cell.run_dir):
            if cell.layout.config.exists():  # begun between the check above and the lock
                return f"{cell.run_dir} was begun here meanwhile"
            # a file the import would write over, or take out again with its own on a refusal (hidden names, which
            # an archive never holds, and the record of a failure here, which the import makes stale, excepted)
            here = [n for n in entries(cell.run_dir) if not n.startswith(".") and n != FAILED_FILE]
            if here:
                return (f"{cell.run_dir} holds files here ({', '.join(here[:5])}); to import the archive's cell, "
                        "move them away first")
            staging = Path(tempfile.mkdtemp(prefix=f".import-{cell.run_dir.name}-", dir=cell.run_dir.parent))
            try:
                for name, member in names.items():
                    with tar.extractfile(member) as source, open(staging / name, "wb") as target:
                        shutil.copyfileobj(source, target)
                order = [n for n in names if n not in LAST] + list(LAST)
                for name in order:
                    os.replace(staging / name, cell.run_dir / name)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            state = cell_state(cell, grid.spec.eval)
            if state.status != "evaluated":
                for name in reversed(order):  # the markers first: the cell is never half there
                    (cell.run_dir / name).unlink(missing_ok=True)
                return f"not evaluated as this grid asks once unpacked ({state.describe()}); taken out again"
            if FAILED_FILE not in names:  # a failure recorded here (before the cell trained elsewhere) is over
                (cell.run_dir / FAILED_FILE).unlink(missing_ok=True)
    except ConfigError as err:  # the run lock is held: this machine is training or evaluating it
        return str(err)
    return None
