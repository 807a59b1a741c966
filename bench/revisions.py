"""Another git revision's copy of one source file, loaded as a module of its own beside the current package
(for the ``*_versions.py`` benches, which compare this checkout's code with an earlier revision's)."""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def module_at_revision(rev: str, path: str, name: str) -> ModuleType:
    """``path`` (e.g. ``src/sanlab/decoding/search.py``) as it is at ``rev``, imported as module ``name``; its own
    imports of the package resolve to the package as it is now."""
    # git runs in this checkout whatever the working directory (it ran where the bench was started from)
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True)
    if shown.returncode != 0:  # an unknown revision, or a file that revision lacks: said, not a traceback
        print(f"{Path(sys.argv[0]).name}: error: no {path} at revision {rev!r} of {ROOT}: {shown.stderr.strip()}",
              file=sys.stderr)
        raise SystemExit(2)
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # kept while the process runs: tracebacks read it
    file = folder / f"{name}.py"
    file.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def versions_table(first_column: str, unit: str, names: list[str], seconds: dict[str, list[float]],
                   count: int) -> list[str]:
    """The table of a ``*_versions`` bench: each version's median rate (``count`` per round over the round's
    seconds), the reference (``names[1]``, the other revision) first, and the median of the per-round ratios of
    the reference's seconds over this checkout's (``names[0]``), the rounds' ratios listed under it."""
    rate = {n: statistics.median(count / s for s in seconds[n]) for n in names}
    per_round = [o / c for c, o in zip(seconds[names[0]], seconds[names[1]])]
    return [f"| {first_column} | {unit} | speed ratio |", "|---|---:|---:|",
            f"| {names[1]} (reference) | {rate[names[1]]:.3f} | 1.00 |",
            f"| {names[0]} | {rate[names[0]]:.3f} | {statistics.median(per_round):.3f} |", "",
            "speed ratio: median over rounds of the reference's seconds over this checkout's in the same round "
            f"(rounds: {', '.join(f'{x:.3f}' for x in per_round)})."]


def timed_batches(task, *, rounds: int, updates: int, config_path: str) -> list:
    """The first ``rounds`` x ``updates`` batches of ``task``'s epoch 0, the same for both versions of a ``*_versions``
    bench; too few is a usage error (later rounds would time no updates, at a made-up rate)."""
    epoch = task.epoch_batches(0)
    if len(epoch) < rounds * updates:
        raise SystemExit(f"{Path(sys.argv[0]).name}: error: --rounds {rounds} x --updates {updates} need "
                         f"{rounds * updates} batches; epoch 0 of {config_path} has {len(epoch)}")
    return [epoch[i] for i in range(rounds * updates)]
