"""``train_run``: lock and prepare the run directory, build the task, train or resume (one process or each
process of a torchrun job)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sanlab.config import Config
from sanlab.errors import SanlabError
from sanlab.tasks.base import task_for
from sanlab.training import rundir
from sanlab.training.logging import RunLogger
from sanlab.training.rundir import run_lock
from sanlab.training.shared_files import check_same_files
from sanlab.training.stop_after import StopAfter
from sanlab.runs.build import check_buildable, make_task
from sanlab.runs.provenance import record_session, threads_change
from sanlab.runs.resume import check_training_data, prepare_run_dir


def train_run(config: Config, run_dir: Path, *, overwrite: bool = False, quiet: bool = False,
              allow_changed_data: bool = False, source: str | None = None,
              on_finished: Callable[[dict], None] | None = None,
              before_start: Callable[[], None] | None = None, stop_after: StopAfter | None = None) -> dict:
    """Train (or resume) the run in ``run_dir``. Returns the trainer's summary.

    Resuming on training data that changed since (``check_training_data``) is an error unless
    ``allow_changed_data``. Under torchrun every process calls this; the main one prepares and locks the
    run directory (see ``training.distributed``). ``source``: the config file, named by a config error.
    ``on_finished(summary)`` runs in the main process while it still holds the run's lock (``sanlab compare``
    records a finished cell there, so no other process sees it finished but unrecorded); ``before_start()`` runs
    there once the lock is taken, before anything is written, and may raise to leave the run as it is (``sanlab
    compare``: a cell another invocation finished between its look and the lock). ``stop_after``: this session's
    wall-time limit (``sanlab train --stop-after``): the session then ends at an update boundary with a checkpoint
    to resume from, the summary's ``stopped_after`` says so, and ``on_finished`` is not called (the run has not)."""
    from sanlab.training.compile import dynamo_settings_restored
    from sanlab.training.device import check_cublas_setting, deterministic_algorithms, resolve_device
    from sanlab.training.distributed import from_environment

    check_buildable(config, source=source)
    run_dir = Path(run_dir)
    rundir.check_location(run_dir)  # before the lock, which would create the directory's .lock
    existed = run_dir.is_dir()
    device = resolve_device(config.train.device)
    if config.train.deterministic and device.type == "cuda":
        check_cublas_setting()  # before the run directory is touched
    # deterministic algorithms (and cuBLAS's setting) before the process group: a data-parallel process on CUDA
    # selects its GPU there, which starts CUDA, and the setting made after that was warned of as made too late
    with _threads_restored(), dynamo_settings_restored(config.train.compile), \
            deterministic_algorithms(config.train.deterministic, device) as warning, from_environment(device) as dist:
        with contextlib.ExitStack() as held:  # the main process's lock on the run, for the whole session
            start = _Start()
            with dist.main_first():  # (a failure here stops every process with the main process's message)
                if dist.is_main:
                    # the lock is taken before the directory is prepared: --overwrite and a resume's config rewrite
                    # must never touch a run another process is writing
                    held.enter_context(run_lock(run_dir))
                    if before_start is not None:
                        before_start()
                    start = _Start(new=overwrite or not rundir.is_run(run_dir),
                                   before=None if not existed else [] if overwrite else rundir.entries(run_dir))
                    start.resuming = prepare_run_dir(run_dir, config, overwrite=overwrite)
                    start.data_changes = check_training_data(run_dir, config, allow_changed=allow_changed_data)
            start.resuming = dist.broadcast(start.resuming if dist.is_main else None)
            summary = _train_locked(config, run_dir, start=start, quiet=quiet, dist=dist, warning=warning,
                                    stop_after=stop_after)
            if on_finished is not None and dist.is_main and summary.get("stopped_after") is None:
                on_finished(summary)
            return summary


@contextlib.contextmanager
def _threads_restored():
    """The process's intra-op threads as they were before ``train.threads`` applied (``_train_locked``), once the
    run and its ``on_finished`` are done: the setting is the run's, and a second run or a decoding in the same
    process (a notebook, a grid's cell scored after it trained) must not inherit it."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Start:
    """What preparing the run directory (main process) tells the training that follows."""

    resuming: bool = False
    data_changes: list[str] = field(default_factory=list)  # --allow-changed-data: for the log
    new: bool = False  # a new run, whose failed start is taken back
    before: list[str] | None = None  # the directory's entries before this command (None: it did not exist)


def _train_locked(config: Config, run_dir: Path, *, start: _Start, quiet: bool, dist,
                  warning: str | None = None, stop_after: StopAfter | None = None) -> dict:
    from sanlab.training.loop import Trainer
    from sanlab.training.logging import SilentLogger

    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    # Every failure from here to the first update stops every process alike (``Distributed.all_or_none``): the others
    # wait for the main process in what follows, so its train.log failing to be written must stop them too.
    with dist.all_or_none("starting"):
        log = RunLogger(run_dir, progress=config.train.progress, quiet=quiet) if dist.is_main else SilentLogger(run_dir)
        if dist.is_main:
            _log_start(log, config, dist, start, warning)
    try:
        try:
            task = _start_task(config, run_dir, log, dist)
            if dist.rank > 0:  # same initial weights everywhere (DDP checks), different dropout streams
                torch.manual_seed(config.train.seed * 1_000_003 + dist.rank)
            trainer = Trainer(task=task, config=config.train, run_dir=run_dir, logger=log, dist=dist,
                              stop_after=stop_after)
            if dist.enabled and not start.resuming:  # (every process; a new run told to use fewer processes or
                trainer.check_batches(0)  # smaller batches must not be left behind)
        except SanlabError:  # bad data or settings found at the start, a full GPU: no half-made run is left behind
            if start.new and dist.is_main:
                log.close()
                rundir.undo_start(run_dir, before=start.before)
            raise
        resumed = start.resuming and trainer.resume()
        with dist.all_or_none("starting"):  # the main process's records of this session
            if dist.is_main:
                _record_start(run_dir, config, log, start, resumed=resumed, step=trainer.progress.step,
                              device=dist.device)
        return trainer.fit()
    finally:
        log.close()


def _log_start(log, config: Config, dist, start: _Start, warning: str | None) -> None:
    """train.log's first lines of a session (main process): what runs it, and what it was warned of."""
    from sanlab.training.device import describe_environment

    if dist.enabled and torch.get_num_threads() * dist.world_size > (os.cpu_count() or 1):
        log.info(f"WARNING: {dist.world_size} processes x {torch.get_num_threads()} threads on {os.cpu_count()} "
                 "cores: oversubscribed (train.threads is per process)")
    log.info(describe_environment(dist.device, precision=config.train.precision, processes=dist.world_size,
                                  compiled=config.train.compile_backend if config.train.compile else None,
                                  deterministic=config.train.deterministic))
    if warning:
        log.info(f"WARNING: {warning}")
    if dist.enabled:
        backend = "nccl" if dist.device.type == "cuda" else "gloo"
        log.info(f"distributed data parallel: {dist.world_size} processes ({backend}), "
                 f"{config.train.accum_steps * dist.world_size} batches per update")
    for change in start.data_changes:
        log.info(f"WARNING: training data changed since this run last trained on it (--allow-changed-data): {change}")


def _record_start(run_dir: Path, config: Config, log, start: _Start, *, resumed: bool, step: int,
                  device: torch.device) -> None:
    """The main process's records of a session about to train: the session in meta.json, and in train.log what a
    resume changed (other CPU threads) or what a new start replaces (records of a session killed before its first
    checkpoint)."""
    if resumed and device.type == "cpu":  # (a GPU's sums do not use the threads)
        _warn_of_other_threads(run_dir, log, step=step)
    if not start.resuming:
        reached = log.truncate_after(0)
        if reached is not None:
            log.info(f"an interrupted session had logged updates up to {reached:,} before its first checkpoint: "
                     "training starts again from update 0 and replaces their records")
    record_session(run_dir, config, step=step)


def _start_task(config: Config, run_dir: Path, log, dist):
    """The task's training side (``make_task``). The main process builds it first, writing the vocabulary /
    subword model(s) into the run directory; the others wait for it, then read those (``main=False``) and write
    nothing, once every process's copies are found to hold the main process's bytes (``training.shared_files``).
    Another process's failure there (its node lacks the test set) stops every process, naming it."""
    task = None
    with dist.main_first():  # (the others hash the files only once the main process has written them)
        if dist.is_main:
            task = make_task(config, run_dir, log)
    check_same_files(dist, task_for(config).shared_files(config, run_dir))
    # every process learns whether the others built theirs: one failing alone left the main process going on into
    # DDP's set-up, where the others waited for it (gloo's "connection closed"; NCCL by hand: 4 hours)
    with dist.all_or_none("starting"):
        if not dist.is_main:
            task = make_task(config, run_dir, log, main=False)
    return task


def _warn_of_other_threads(run_dir: Path, log, *, step: int) -> None:
    """A resume with other CPU threads goes on (``train.threads`` is a resumable key), but train.log says it is
    not the run it was. Called before this session is added to meta.json's sessions."""
    changed = threads_change(run_dir, step=step)
    if changed:
        log.info(f"WARNING: not an exact resume: {changed}")
