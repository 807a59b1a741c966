"""What a run records about where it came from: library versions, git revision, command line, threads and
processes (``meta.json``), and one record per training session."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import datetime
from importlib import metadata
from pathlib import Path

import torch

from sanlab import invocation
from sanlab.config import Config
from sanlab.files import read_json, write_json
from sanlab.training.layout import RunLayout
from sanlab.training.rundir import RUN_FORMAT, RUN_MARKER


LIBRARIES = ("torch", "sacrebleu", "sentencepiece", "conllu", "safetensors", "pydantic", "numpy")


def git_revision() -> str | None:
    try:
        root = Path(__file__).resolve().parents[2]
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if rev.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(config: Config) -> dict:
    versions = {}
    for lib in ("sanlab",) + LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    return {RUN_MARKER: RUN_FORMAT, "seed": config.train.seed, "versions": versions, "python": platform.python_version(),
            "git_revision": git_revision(), "command": invocation.command(), "machine": platform.machine(),
            **_session_conditions(config)}


GRID_JOBS_ENV = "SANLAB_GRID_JOBS"


ALLOW_CHANGED_DATA_ENV = "SANLAB_ALLOW_CHANGED_DATA"  # `sanlab compare --allow-changed-data`, seen by its workers


def _session_conditions(config: Config) -> dict:
    # threads as training will set them (meta.json is written before _train_locked applies train.threads)
    # jobs: cells a `sanlab compare --jobs` grid trains side by side with this one (set in its workers)
    # device, precision, compile, deterministic: what else a speed depends on (experiments/cells.speed_conditions)
    return {"threads": config.train.threads or torch.get_num_threads(),
            "processes": int(os.environ.get("WORLD_SIZE", "1")), "jobs": int(os.environ.get(GRID_JOBS_ENV, "1")),
            "device": device_label(config.train.device), "precision": config.train.precision,
            "compile": config.train.compile, "deterministic": config.train.deterministic}


def device_label(spec: str) -> str:
    """``cpu``, or ``cuda (NVIDIA H100 80GB HBM3)``: the kind of device a ``train.device`` value trains on
    here (the spec itself when this machine cannot resolve it; training then stops with the reason)."""
    from sanlab.errors import ConfigError
    from sanlab.training.device import resolve_device

    try:
        device = resolve_device(spec)
    except ConfigError:
        return spec
    return "cpu" if device.type == "cpu" else f"{device.type} ({torch.cuda.get_device_name(device)})"


def record_session(run_dir: Path, config: Config, *, step: int) -> None:
    """Append this training session to ``meta.json``'s ``sessions``: a resumed run may have been continued
    with other code, command, threads or processes than the ones recorded when it was created."""
    path = RunLayout(run_dir).meta
    meta = read_json(path) or provenance(config)
    session = {"started_at": datetime.now().astimezone().isoformat(timespec="seconds"), "from_step": step,
               "git_revision": git_revision(), "command": invocation.command(), **_session_conditions(config)}
    meta["sessions"] = [*meta.get("sessions", []), session]
    meta.setdefault(RUN_MARKER, RUN_FORMAT)  # a run made before the marker is marked when it trains again
    write_json(path, meta)


def threads_change(run_dir: Path, *, step: int) -> str:
    """Why resuming at update ``step`` with this process's intra-op threads is not exact, or "": the session that
    computed the updates up to ``step`` (the last one recorded as starting before it) used another number of
    CPU threads (``train.threads``, or the cores of its machine when unset), and a CPU reduction split over
    other threads adds in another order. "" also when no session recorded its threads (older runs)."""
    sessions = (read_json(RunLayout(run_dir).meta) or {}).get("sessions", [])
    before = [s for s in sessions if isinstance(s, dict) and isinstance(s.get("from_step"), int)
              and s["from_step"] < step]
    then, now = (before[-1].get("threads") if before else None), torch.get_num_threads()
    if not isinstance(then, int) or then == now:
        return ""
    return (f"the updates up to {step:,} were computed with {then} CPU thread(s) and this session uses {now} "
            "(train.threads, or this machine's cores when unset): the CPU's sums round differently from here on")


# Keys that may change when a run is resumed (they do not change what was already trained).
