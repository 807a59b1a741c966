"""Argument parsing of ``sanlab compare`` (kept apart so ``sanlab --help`` imports nothing heavy).

Wired into ``sanlab.cli`` by ``register(sub)``; the work is ``sanlab.experiments.compare.run_compare``.
"""

from __future__ import annotations

import argparse

from sanlab.training.stop_after import duration_argument


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``compare`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("compare", help="train/evaluate a grid of variants x seeds and print the comparison "
                              "table (reuses finished cells, resumes interrupted ones)")
    p.add_argument("grid", help="grid YAML (see configs/compare/ and docs/compare.md)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every cell, e.g. --set train.max_steps=2000 (repeatable)")
    p.add_argument("--device", help="where the cells train and are evaluated: auto | cpu | cuda | cuda:N (the same as "
                   "--set train.device=...; a finished cell is not trained again for it)")
    p.add_argument("--dry-run", action="store_true", help="list the cells and their state; run nothing")
    p.add_argument("--table-only", action="store_true", help="print the table from what exists and write it to the runs directory (table.md/.csv/.json); train nothing")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="ARCHIVE",
                   help="add the finished, scored cells of ARCHIVE (a .tar.gz of cell files, e.g. from "
                   "scripts/gpu_check.sh's table1 step) to the grid, each whole or not at all, never over a cell "
                   "begun here; then print the table (repeatable; docs/compare.md)")
    p.add_argument("--rescore", action="store_true",
                   help="tagging: score the evaluated cells again from their predictions (tags-*.jsonl.gz) with the "
                   "current word-group definitions, without checkpoints; then print the table (docs/compare.md)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="cells run in parallel processes (each with cores/N threads)")
    p.add_argument("--only", action="append", default=[], metavar="VARIANT",
                   help="run only this variant (name or directory slug; repeatable); the table shows all")
    p.add_argument("--dataset", action="append", default=[], metavar="NAME",
                   help="run only this dataset of a grid with datasets (repeatable)")
    p.add_argument("--datasets", dest="datasets_file", metavar="FILE",
                   help="YAML file whose `datasets:` list replaces the grid's, e.g. to run a paper grid on your own "
                   "treebank; cells go to runs/compare/<grid>-<file> unless --runs-dir (docs/compare.md)")
    p.add_argument("--seed", dest="seeds", action="append", default=[], type=int, metavar="N",
                   help="run only this seed of the chosen variants (repeatable), e.g. to train one cell at a time")
    p.add_argument("--runs-dir", help="where the cells go (default: the grid's runs_dir or runs/compare/<grid>)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or training log lines on the console")
    p.add_argument("--allow-changed-data", action="store_true",
                   help="resume cells even though their training data changed since they last trained on it")
    p.add_argument("--stop-after", type=duration_argument, metavar="DURATION",
                   help="bound this invocation: once DURATION (90s, 9m, 1.5h; a unit is required) has passed since "
                        "the command started, the cell training stops at an update boundary with a checkpoint "
                        "(resumable, as `sanlab train --stop-after`), no cell begins and none is evaluated; each such "
                        "cell's line says what it was left as (not failed), the output ends with a line naming them, "
                        "e.g. \"NOT FINISHED: 2 cell(s) left by --stop-after 9m, resumable ...\", and the exit status "
                        "is 0 where only the limit left cells (1 if a cell failed); rerun the same command to go on")
    p.set_defaults(fn=_cmd_compare)
    return p


def _cmd_compare(args) -> int:
    from sanlab.experiments.compare import run_compare
    from sanlab.invocation import environment_variable
    from sanlab.errors import ConfigError
    from sanlab.runs import ALLOW_CHANGED_DATA_ENV
    from sanlab.training.device import DEVICE_SPEC
    from sanlab.training.stop_after import StopAfter

    if args.device and not DEVICE_SPEC.match(args.device):  # named as given, not as the --set it becomes
        raise ConfigError(f"--device {args.device!r}: expected auto, cpu, cuda or cuda:N")
    # through the environment, so that the grid's worker processes see it too
    with environment_variable(ALLOW_CHANGED_DATA_ENV, "1" if args.allow_changed_data else None):
        overrides = args.overrides + ([f"train.device={args.device}"] if args.device else [])
        return run_compare(args.grid, overrides=overrides, runs_dir=args.runs_dir, dry_run=args.dry_run,
                           table_only=args.table_only, rescore=args.rescore, jobs=args.jobs, only=args.only,
                           datasets=args.dataset, seeds=args.seeds, datasets_file=args.datasets_file,
                           quiet=args.quiet, imports=args.imports,
                           stop_after=None if args.stop_after is None else StopAfter.starting(args.stop_after,
                                                                                              args.started))
