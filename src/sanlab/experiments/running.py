"""Choosing and running the cells of a comparison grid: ``--only``/``--dataset`` selection, the
``--dry-run`` listing, the order (breadth-first over seeds, or as ``--only`` names the variants), and
``--jobs`` process pools that survive a dying worker. ``compare`` builds the table from what these
runs leave behind.
"""

from __future__ import annotations

import os
import signal
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path

from sanlab.errors import ConfigError
from sanlab.experiments.cells import (
    CellOutcome, cores, init_worker, last_speed, machine, prepare_synthetic, read_failure, record_failure, refused,
    run_cell, run_cell_job, speed_conditions,
)
from sanlab.experiments.grid_schema import Cell, Grid, slug
from sanlab.experiments.grid_state import cell_state, read_done
from sanlab.training.logging import duration
from sanlab.training.stop_after import StopAfter


def select_cells(grid: Grid, *, only: Sequence[str] = (), datasets: Sequence[str] = (),
                 seeds: Sequence[int] = ()) -> list[Cell]:
    """The cells of the named variants / datasets (names or their directory slugs) and seeds; all if none
    named. A seed needs only to be one of some chosen variant's (the baseline often has more seeds).

    Order: with ``only``, the variants in the order named (a name given twice counts where it first
    appears), each over the datasets and seeds in the order named (else the grid's), and ``run_grid``
    keeps it (``keep_order``); without, the grid's order, which ``run_order`` makes breadth-first."""
    def pick(names: Sequence[str], known: list[str], kind: str) -> list[str]:
        chosen: dict[str, None] = {}
        for name in names:
            match = [k for k in known if name in (k, slug(k))]
            if not match:
                hint = " (a YAML file of datasets goes to --datasets)" if name.endswith((".yaml", ".yml")) else ""
                raise ConfigError(f"{grid.path}: no {kind} {name!r}; the grid has: {', '.join(known)}{hint}")
            chosen.update(dict.fromkeys(match))
        return list(chosen) or known

    variants = pick(only, [v.name for v in grid.spec.variants], "variant")
    if datasets and not grid.spec.datasets:
        raise ConfigError(f"{grid.path}: --dataset {datasets[0]!r}, but this grid has no datasets")
    sets = pick(datasets, [d.name for d in grid.spec.datasets], "dataset") if grid.spec.datasets else [None]
    chosen = [c for c in grid.cells if c.variant in variants and c.dataset in sets]
    missing = sorted(set(seeds) - {c.seed for c in chosen})
    if missing:
        have = sorted({c.seed for c in chosen})
        raise ConfigError(f"{grid.path}: no cell with seed {missing[0]} among the chosen variants; their seeds: "
                          f"{', '.join(map(str, have))}")
    chosen = [c for c in chosen if not seeds or c.seed in seeds]
    if only:
        seed_order = list(dict.fromkeys(seeds))
        chosen.sort(key=lambda c: (variants.index(c.variant), sets.index(c.dataset),
                                   seed_order.index(c.seed) if seeds else grid.seeds_of(c.variant).index(c.seed)))
    return chosen


def describe_cells(grid: Grid, cells: Sequence[Cell]) -> str:
    """The ``--dry-run`` listing: one line per cell with its state, run directory and, for a cell with updates
    left, how long they take here (``_updates_left``), then the count and the total (``time_left``'s line)."""
    def state(cell: Cell) -> str:
        described, error = cell_state(cell, grid.spec.eval), read_failure(cell)
        failed = error and described.status != "evaluated"
        progress = _logged_past(cell, described.step) if described.status == "training" else ""
        return described.describe(progress) + (f" (last attempt failed: {error})" if failed else "")

    left = _updates_left(grid, cells)
    rows = [(c.label, state(c), str(c.run_dir), _cell_estimate(left, c)) for c in cells]
    width = [max(len(r[k]) for r in rows) for k in range(3)]
    lines = [f"{a:<{width[0]}}  {b:<{width[1]}}  {d:<{width[2]}}{e}".rstrip() for a, b, d, e in rows]
    done = sum(cell_state(c, grid.spec.eval).status == "evaluated" for c in cells)
    estimate = _time_left_line(left)
    return "\n".join(lines + [f"{done} of {len(cells)} cells evaluated"] + ([estimate] if estimate else []))


def _logged_past(cell: Cell, step: int | None) -> str:
    """How far a cell's log has gone past the checkpoint it would resume from (the state's step): a process
    training it now logs every ``log_every`` updates and saves only at validations."""
    from datetime import datetime, timezone

    from sanlab.training.logging import read_metrics

    try:
        logged = [r for r in read_metrics(cell.run_dir) if r.get("split") == "train" and "step" in r]
    except ConfigError:  # a damaged log: the listing still shows the saved state
        return ""
    if not logged or logged[-1]["step"] <= (step or 0):
        return ""
    when = datetime.fromtimestamp(logged[-1]["time"], timezone.utc) if "time" in logged[-1] else None
    return f" (its log has reached update {logged[-1]['step']:,}{f', {when:%Y-%m-%d %H:%M} UTC' if when else ''})"


def time_left(grid: Grid, cells: Sequence[Cell]) -> str | None:
    """How long the updates of the chosen cells not yet trained take on this machine, one cell at a time
    (``_updates_left``, summed). None when no cell was trained here or nothing is left. Validation and
    evaluation come on top; cells side by side (``--jobs``) change the pace."""
    return _time_left_line(_updates_left(grid, cells))


@dataclass(frozen=True)
class _Left:
    """What ``_updates_left`` found: seconds of updates by run directory, the run directories whose cells may
    stop sooner (early stopping), and the cells whose speeds it used (how many; trained one at a time?)."""
    seconds: dict[Path, float]
    early_stopping: frozenset[Path]
    speed_cells: int
    alone: bool


def _cell_estimate(left: _Left, cell: Cell) -> str:
    if cell.run_dir not in left.seconds:
        return ""
    bound = "at most " if cell.run_dir in left.early_stopping else ""
    return f"  {bound}{_about(left.seconds[cell.run_dir], '~')} of updates"


def _time_left_line(left: _Left) -> str | None:
    if not left.seconds:
        return None
    count, trained = len(left.seconds), left.speed_cells
    bound = "at most " if left.early_stopping else ""
    how = "one at a time" if left.alone else "side by side (each slower than alone)"
    stops = "; early stopping (train.patience) may end cells sooner" if left.early_stopping else ""
    return (f"{bound}{_about(sum(left.seconds.values()), 'about ')} of updates left for {count} "
            f"cell{'s' if count > 1 else ''}, one at a time, at the speed of the {trained} "
            f"cell{'s' if trained > 1 else ''} trained {how} on this machine (by variant where there are some); "
            f"validation and evaluation come on top{stops}")


def _updates_left(grid: Grid, cells: Sequence[Cell]) -> _Left:
    """Seconds of updates each chosen cell not yet trained needs on this machine: its remaining steps (fewer
    than ``max_steps`` where ``max_epochs`` ends it first, at the updates per epoch of the grid's finished cells
    of its dataset) at the median speed (updates per second of update time) of the grid's cells trained on this
    machine, of its own variant where there are some, and of cells trained one at a time where there are some
    (side by side, each trains slower). Empty when no cell was trained here. (A cell stopped before its end
    resumes only where its run directory, checkpoints included, survives: pick cells that fit the time at
    hand.)"""
    finished = _finished_cells(grid)
    here = [f for f in finished if f.speed]
    alone = [f for f in here if f.alone]
    used = alone or here
    speeds: dict[str, list[float]] = {}
    for f in used:
        speeds.setdefault(f.cell.variant, []).append(f.speed)
    if not speeds:
        return _Left({}, frozenset(), 0, False)
    overall = statistics.median(f.speed for f in used)
    per_epoch: dict[str | None, list[float]] = {}
    for f in finished:
        if f.steps_per_epoch:
            per_epoch.setdefault(f.cell.dataset, []).append(f.steps_per_epoch)
    seconds, early = {}, set()
    for cell in cells:
        state = cell_state(cell, grid.spec.eval)
        if state.status not in ("pending", "training"):
            continue
        train, done_steps = cell.config.train, state.step or 0
        last = train.max_steps
        if per_epoch.get(cell.dataset):
            last = min(last, round(train.max_epochs * statistics.median(per_epoch[cell.dataset])))
        steps = max(last - done_steps, 0)
        if steps:
            seconds[cell.run_dir] = steps / statistics.median(speeds.get(cell.variant, [overall]))
            if train.patience:
                early.add(cell.run_dir)
    return _Left(seconds, frozenset(early), len(used), bool(alone))


@dataclass(frozen=True)
class _Finished:
    cell: Cell
    speed: float | None           # updates per second of update time, if trained on this machine
    alone: bool                   # trained one cell at a time (every session)
    steps_per_epoch: float | None  # updates per epoch, from where it stopped


def _finished_cells(grid: Grid) -> list[_Finished]:
    """The grid's finished cells (``done.json``), with what the estimate needs of each. A cell whose files
    cannot be read is left out (``cell_state`` calls it a conflict): one damaged cell must not stop the listing."""
    here, found = machine(), []
    for cell in grid.cells:
        if not cell.layout.done.is_file():
            continue
        try:
            done = read_done(cell) or {}
            speed = last_speed(cell.run_dir) if done.get("machine") == here else None
            conditions = speed_conditions(cell.run_dir, done) if speed else ""
        except ConfigError:
            continue
        summary = done.get("summary") or {}
        accum = (((done.get("config") or {}).get("train") or {}).get("accum_steps")) or 1
        step, epoch = summary.get("step") or 0, summary.get("epoch") or 0
        # the updates of the epoch it stopped in do not count as a whole epoch
        per_epoch = (step - (summary.get("position") or 0) / accum) / epoch if epoch else None
        found.append(_Finished(cell, speed["steps_per_s"] if speed and speed["steps_per_s"] > 0 else None,
                               conditions.startswith("1 job x"), per_epoch if per_epoch and per_epoch > 0 else None))
    return found


def _about(seconds: float, approximately: str) -> str:
    """``"~12 min"`` (with ``approximately="~"``), ``"1 h 05 min"``; ``"under a minute"``, not ``"~0 min"``, for a
    smoke grid's cells."""
    return "under a minute" if seconds < 30 else approximately + _duration(seconds)


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def run_order(grid: Grid, cells: Sequence[Cell]) -> list[Cell]:
    """Breadth-first over seeds: every row's first seed, then every row's second, and so on.

    A grid that runs for days is stopped and its table committed partway; this way each row has a
    score early, and the extra seeds of the baseline fill in afterwards instead of first.
    """
    def rank(cell: Cell) -> int:
        return grid.seeds_of(cell.variant).index(cell.seed)
    return sorted(cells, key=rank)  # stable: the grid's row order within one rank


def run_grid(grid: Grid, cells: Sequence[Cell], *, jobs: int = 1, quiet: bool = False,
             log: Callable[[str], None] = print, keep_order: bool = False,
             after_cell: Callable[[CellOutcome], None] | None = None,
             stop_after: StopAfter | None = None) -> list[CellOutcome]:
    """Train and evaluate every cell not evaluated yet, in ``run_order`` (or in the order of ``cells`` with
    ``keep_order``: ``--only``); ``jobs`` > 1 runs cells in spawned processes, each with ``cores // jobs``
    threads, started in that order. A failing cell is reported and the others go on. ``after_cell`` is
    called as each cell finishes (``run_compare`` rewrites the table there). ``stop_after`` (``sanlab compare
    --stop-after``) bounds the whole invocation: a cell training at the limit stops there, resumable, and the
    cells not begun by then are not (``run_cell``); each is reported as such, not as failed. The cells in conflict
    are reported first, before any cell trains: found from their files alone, and never to be reached past a limit."""
    prepare_synthetic(grid)
    states = [(c, cell_state(c, grid.spec.eval)) for c in cells]
    todo = [c for c, state in states if state.status != "evaluated"]
    todo = todo if keep_order else run_order(grid, todo)
    threads = max(1, cores() // jobs)
    log(f"{len(cells) - len(todo)} of {len(cells)} cells already evaluated; {len(todo)} to run"
        + (f" with {jobs} jobs x {threads} thread{'s' if threads > 1 else ''}" if jobs > 1 and len(todo) > 1 else ""))
    outcomes = []

    def report(outcome: CellOutcome) -> None:
        outcomes.append(outcome)
        log(outcome_line(outcome, done=len(outcomes), total=len(todo)))
        if after_cell is not None:
            try:
                after_cell(outcome)
            except Exception as err:  # noqa: BLE001  (the table is rebuilt at the end; the grid goes on)
                log(f"could not rewrite the table after {outcome.cell.label}: {type(err).__name__}: {err}")

    conflicts = {c.run_dir: state for c, state in states if state.status == "conflict"}
    for cell in todo:
        if cell.run_dir in conflicts:
            report(refused(cell, conflicts[cell.run_dir]))
    runnable = [c for c in todo if c.run_dir not in conflicts]  # (``run_cell`` looks again at each one's turn)
    if jobs <= 1 or len(runnable) <= 1:
        for cell in runnable:
            report(run_cell(cell, grid.spec.eval, quiet=quiet, jobs=1, stop_after=stop_after))
        return outcomes
    # A worker that dies (e.g. the OOM killer) breaks the pool, which then fails every cell it held, not
    # only the culprit. The first time, those cells go to a new pool of the same width (they resume from
    # their checkpoints); after that, each goes to a pool of its own, so a death names its cell.
    remaining, width, breaks = list(runnable), min(jobs, len(runnable)), 0
    while remaining:
        batches = [remaining] if breaks < 2 else [[c] for c in remaining]
        remaining = []
        for batch in batches:
            remaining += _run_pool(grid, batch, workers=width, threads=threads, report=report, alone=breaks >= 2,
                                   stop_after=stop_after)
        if remaining:
            breaks += 1
            log(f"a worker process died; {len(remaining)} cell(s) go to "
                + ("a new pool" if breaks < 2 else "pools of their own, one at a time, to find the one that dies"))
    return outcomes


def _run_pool(grid: Grid, cells: Sequence[Cell], *, workers: int, threads: int, report: Callable[[CellOutcome], None],
              alone: bool, stop_after: StopAfter | None = None) -> list[Cell]:
    """Run ``cells`` in one process pool; returns the cells a broken pool left unfinished (or, when a cell
    ran ``alone`` in its pool, reports it as failed: the death was its own)."""
    broken, side_by_side = [], 1 if alone else workers
    pool = ProcessPoolExecutor(max_workers=side_by_side, mp_context=get_context("spawn"),
                               initializer=init_worker, initargs=(threads, side_by_side, os.getpid()))
    try:
        # the workers start with SIGINT blocked (they inherit the mask) until ``init_worker`` ignores it: a Ctrl-C
        # while one is still importing would crash it loudly; here it waits, pending, until the submits are done
        masked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, "pthread_sigmask") \
            else None
        try:
            futures = {pool.submit(run_cell_job, (c, grid.spec.eval, True, side_by_side, stop_after)): c
                       for c in cells}
        finally:
            if masked is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, masked)
        _collect(futures, broken, report=report, alone=alone)
    except BaseException:  # Ctrl-C: stop now, not after every cell already handed to the pool has trained
        _stop_pool(pool)
        raise
    pool.shutdown(wait=True)
    return broken


def outcome_line(outcome: CellOutcome, *, done: int, total: int) -> str:
    """The grid's line for a finished cell, the ``done``-th of ``total``."""
    what = "+".join(w for w, on in (("trained", outcome.trained), ("evaluated", outcome.evaluated)) if on)
    status = f"FAILED: {outcome.error}" if outcome.error else outcome.stopped or what or "nothing to do"
    return f"[{done}/{total}] {outcome.cell.label}: {status} ({duration(outcome.seconds)})"


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel the cells not started and end the workers (they ignore SIGINT, ``init_worker``): a cell stopped
    mid-training resumes from its last checkpoint, which is renamed into place whole, and its lock goes with
    its process."""
    workers = list((getattr(pool, "_processes", None) or {}).values())  # the executor keeps no public list
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.terminate()
    for process in workers:
        process.join(timeout=60)


# How often the grid process stops waiting for its workers to answer a Ctrl-C that another of its threads
# received: the kernel may deliver SIGINT to any thread not blocking it, and then a main thread blocked in a lock
# wait with no timeout sees the exception only when a cell ends (hours later).
SIGNAL_POLL_S = 0.5


def _collect(futures: dict, broken: list[Cell], *, report: Callable[[CellOutcome], None], alone: bool) -> None:
    """Report each cell's outcome as it comes; a cell a broken pool left unfinished goes to ``broken``."""
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=SIGNAL_POLL_S, return_when=FIRST_COMPLETED)
        for future in sorted(done, key=list(futures).index):  # cells ending together: in the order submitted
            _report_one(future, futures[future], broken, report=report, alone=alone)


def _report_one(future, cell: Cell, broken: list[Cell], *, report: Callable[[CellOutcome], None],
                alone: bool) -> None:
    """One finished future's outcome (``_collect``): reported, or, for a cell a broken pool left unfinished,
    put in ``broken``."""
    try:
        outcome = future.result()
    except BrokenProcessPool as err:
        if not alone:
            broken.append(cell)
            return
        outcome = CellOutcome(cell, False, False, 0.0, f"its worker process died ({err}), also when it "
                                                       "ran in a pool of its own")
        record_failure(outcome)
    except Exception as err:  # noqa: BLE001  (the grid goes on)
        outcome = CellOutcome(cell, False, False, 0.0, f"{type(err).__name__}: {err}")
        record_failure(outcome)
    report(outcome)
