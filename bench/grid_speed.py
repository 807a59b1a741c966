"""Training speed of every variant of a comparison grid, measured alike: the papers' speed column.

The grid's cells record their own speed, but cells trained side by side (`--jobs 2`) slow each other
by an amount that depends on the neighbour, and cells trained in different sessions see different
loads. Here one process builds every variant's model and task from its cell config (the grid's first
seed), takes the same real batches of epoch 0, and times the trainer's own update (`Trainer.update`:
forward, backward, clipping, optimizer step) in rounds: each round runs U updates of every variant,
in an order that rotates from round to round, so a load change hits all variants alike. Reported:
median over rounds of updates/s and tokens/s, and the median over rounds of the ratio to the baseline's
updates/s in the same round (paired by round, so a round that ran faster for everyone cancels out).

    .venv/bin/python bench/grid_speed.py configs/compare/dufter-table2-ud.yaml --threads 2 \\
        --updates 20 --rounds 3 --out results/dufter-ewt-speed.md

Run it alone on the machine (docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from itertools import cycle
from pathlib import Path

import torch

from sanlab.experiments.cells import prepare_synthetic
from sanlab.experiments.grid import Cell, Grid, load_grid
from sanlab.models.builders import count_parameters
from sanlab.runs import make_task
from sanlab.training.logging import SilentLogger
from sanlab.training.loop import Trainer
from report import check_out, machine, run_main, whole_number, write_out  # bench/report.py


@dataclass
class Contender:
    """One variant ready to train: its trainer and an endless supply of update groups."""

    cell: Cell
    trainer: Trainer
    groups: cycle
    params: int
    seconds: list[float] = field(default_factory=list)   # per round: update time
    tokens: list[int] = field(default_factory=list)      # per round: target tokens (words for tagging)
    updates: list[int] = field(default_factory=list)     # per round

    def run(self, updates: int) -> tuple[float, int]:
        """Time ``updates`` updates (the batches are made before each is timed); the trainer's read of their
        losses ends the timing, since an update does not wait for the device (``training.interval``)."""
        seconds, tokens = 0.0, 0
        for k in range(updates):
            group = next(self.groups)
            start = time.perf_counter()
            _, n = self.trainer.update(group)
            if k == updates - 1:
                self.trainer.settle()  # waits for the device; stops on a non-finite loss
            seconds += time.perf_counter() - start
            tokens += n
        return seconds, tokens


def prepare(cell: Cell) -> Contender:
    """The cell's task (data, vocabulary, model) and trainer in a scratch run directory."""
    config = cell.config
    torch.manual_seed(config.train.seed)
    log = SilentLogger(cell.run_dir)  # the grid was loaded with a scratch runs_dir
    task = make_task(config, cell.run_dir, log)
    trainer = Trainer(task=task, config=config.train, run_dir=cell.run_dir, logger=log)
    batches = task.epoch_batches(0)
    per_update = config.train.accum_steps
    groups = [batches[i:i + per_update] for i in range(0, len(batches) - per_update + 1, per_update)]
    return Contender(cell, trainer, cycle(groups), count_parameters(task.model))


def first_seed_cells(grid: Grid, dataset: str | None) -> list[Cell]:
    if grid.spec.datasets and dataset is None:
        dataset = grid.spec.datasets[0].name
    seen, cells = set(), []
    for cell in grid.cells:
        if cell.dataset == dataset and cell.variant not in seen:
            seen.add(cell.variant)
            cells.append(cell)
    return cells


def add_grid_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments every grid bench takes: which grid, overrides, dataset, variants, threads."""
    p.add_argument("grid", help="grid YAML (configs/compare/...)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every variant")
    p.add_argument("--dataset", help="for a grid with datasets: which one (default: the first)")
    p.add_argument("--only", action="append", default=[], metavar="VARIANT", help="these variants (and the baseline)")
    p.add_argument("--threads", type=whole_number, default=2)


def refuse_unknown_variants(grid: Grid, option: str, names: list[str] | None) -> None:
    """Stop (status 2, as a usage error) when ``names`` holds a variant the grid has not, naming the grid's: an
    unknown name used to be left out silently, and the bench timed the others as if it had been asked to."""
    known = [v.name for v in grid.spec.variants]
    unknown = [name for name in names or [] if name not in known]
    if unknown:
        print(f"{Path(sys.argv[0]).name}: error: {option}: no variant named {', '.join(map(repr, unknown))} in "
              f"{grid.path}; its variants are: {', '.join(known)}", file=sys.stderr)
        raise SystemExit(2)


def bench_cells(grid: Grid, args: argparse.Namespace) -> list[Cell]:
    """The first seed's cell of every variant asked for (``--only``, always with the baseline)."""
    refuse_unknown_variants(grid, "--only", args.only)
    return [c for c in first_seed_cells(grid, args.dataset)
            if not args.only or c.variant in args.only or c.variant == grid.baseline]


def provenance(script: str, grid: Grid, args: argparse.Namespace, cells: list[Cell], measured: str) -> list[str]:
    """The lines under a bench table's title: command, machine, date, what was measured, grid."""
    return [f"- command: `python bench/{script} {' '.join(sys.argv[1:])}`",
            f"- machine: {machine(getattr(args, 'device', None))}, {torch.get_num_threads()} torch thread(s)",
            f"- date: {datetime.now().astimezone().isoformat(timespec='seconds')}",
            f"- measured: {measured}",
            f"- grid: {grid.path}" + (f" (dataset {cells[0].dataset})" if cells[0].dataset else "")
            + (f"; overrides: {' '.join(args.set)}" if args.set else ""), ""]


def table(contenders: list[Contender], baseline: str) -> list[str]:
    base = next(c for c in contenders if c.cell.variant == baseline)
    base_rates = [u / s for u, s in zip(base.updates, base.seconds)]
    lines = ["| variant | params | updates/s (median) | tokens/s (median) | speed vs baseline (median of per-round ratios) "
             "| updates/s per round |",
             "|---|---:|---:|---:|---:|---|"]
    for c in contenders:
        ups = [u / s for u, s in zip(c.updates, c.seconds)]
        tps = [n / s for n, s in zip(c.tokens, c.seconds)]
        name = c.cell.variant + (" (baseline)" if c is base else "")
        lines.append(f"| {name} | {c.params:,d} | {statistics.median(ups):.2f} | {statistics.median(tps):,.0f} | "
                     f"{statistics.median(u / b for u, b in zip(ups, base_rates)):.2f} | "
                     f"{' '.join(f'{u:.2f}' for u in ups)} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_grid_arguments(p)
    p.add_argument("--updates", type=whole_number, default=20, help="timed updates per variant and round")
    p.add_argument("--rounds", type=whole_number, default=3)
    p.add_argument("--warmup", type=int, default=2, help="untimed updates per variant first")
    p.add_argument("--out", help="also write the table to this Markdown file")
    args = p.parse_args()
    check_out(p, args.out, "grid_speed.py")

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="grid-speed-") as tmp:
        grid = load_grid(args.grid, overrides=args.set, runs_dir=tmp)  # never touches the grid's own cells
        prepare_synthetic(grid)
        cells = bench_cells(grid, args)
        contenders = []
        for cell in cells:
            print(f"preparing {cell.label} ...", file=sys.stderr, flush=True)
            contenders.append(prepare(cell))
        for c in contenders:
            c.run(args.warmup)
        for r in range(args.rounds):
            shift = r % len(contenders)
            for c in contenders[shift:] + contenders[:shift]:  # rotate who goes first
                seconds, tokens = c.run(args.updates)
                c.seconds.append(seconds)
                c.tokens.append(tokens)
                c.updates.append(args.updates)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    measured = (f"{args.rounds} rounds x {args.updates} updates per variant (after {args.warmup} untimed), "
                "interleaved, rotating order; batches of epoch 0 of each cell's own data pipeline;"
                f" seed {cells[0].seed}")
    header = [f"# Training speed per variant: {grid.spec.title or grid.name}", "",
              *provenance("grid_speed.py", grid, args, cells, measured)]
    text = "\n".join(header + table(contenders, grid.baseline)) + "\n"
    print(text)
    if args.out:
        write_out(args.out, text)


if __name__ == "__main__":
    run_main(main)
