"""What every bench's report shares: the machine it ran on, the device it was asked for, and its ``--out`` file
(written whole, never over a file some other tool wrote)."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import torch

from sanlab.errors import SanlabError
from sanlab.files import check_report_file, write_text
from sanlab.training.device import cpu_model, resolve_device  # (cpu_model: also report.cpu_model)


def machine(device: torch.device | None = None) -> str:
    """CPU model and cores, the GPU's name where ``device`` is one, torch and Python versions: one line."""
    gpu = f"GPU {torch.cuda.get_device_name(device)}, " if device is not None and device.type == "cuda" else ""
    return (f"{gpu}CPU {cpu_model()} ({os.cpu_count()} cores), {platform.system()}, torch {torch.__version__}, "
            f"python {platform.python_version()}")


def command(script: str) -> str:
    """The command line that made the report, as one can type it again from the checkout."""
    return f"python bench/{script} {' '.join(sys.argv[1:])}".rstrip()


def device_argument(parser: argparse.ArgumentParser, spec: str) -> torch.device:
    """``--device`` as a ``torch.device``, or a usage error (exit 2) where this machine has no such device: CUDA
    asked of a torch without it was an AssertionError traceback from deep in the first ``.to(device)``."""
    try:
        return resolve_device(spec)
    except SanlabError as e:
        parser.error(f"--device: {e}")


def check_out(parser: argparse.ArgumentParser, path: str | Path | None, script: str) -> None:
    """Refuse (a usage error, before anything is measured) an ``--out`` that would overwrite a file this bench did
    not write: a typo could replace a results file or a source file by a table."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        parser.error(f"--out {path}: is a directory")
    try:
        check_report_file(path, script=f"bench/{script}", flag="--out")
    except SanlabError as e:
        parser.error(str(e))


def write_out(path: str | Path, text: str) -> None:
    """``text`` into ``path`` whole (``sanlab.files.write_text``: written beside it, synced, then renamed over
    it), so a bench killed mid-write, or a reader of a table rewritten after every round, never sees half a
    file; the folder is made if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, text)


def whole_number(text: str) -> int:
    """An argparse type for counts of rounds, repeats, updates, threads, sentences: 1 or more (zero rounds
    measured nothing and ended in a traceback: the median of no times)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number of 1 or more")
    return value


def run_main(main):
    """``main()`` (what it returns), with the project's errors (a grid or config not found or invalid) as one
    line, exit 2."""
    try:
        return main()
    except SanlabError as e:
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
