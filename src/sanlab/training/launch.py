"""How ``sanlab train --nproc N`` starts its processes: torchrun, as a child this process watches.

* torchrun runs in a session of its own, so the terminal's Ctrl-C reaches this process alone; this process
  forwards the first SIGINT, SIGTERM or SIGHUP to torchrun, which passes it to its workers and waits for them
  (``launch``). The command then says "interrupted" once, not once per process.
* torchrun's process dies with this one, however this one dies (``die_with_parent``), so no orphan goes on
  training a run that a rerun would find locked.
* A sanlab error in a worker (a user's mistake: a bad data file, a locked run) ends the command as it would end one
  process: its message, exit status 2. The worker writes the message into a file in ``LAUNCH_DIR_ENV``'s directory
  instead of printing it (``tell_launcher``); torchrun's account of the failure (its "Failures:" summary, written
  for crashes) is left out then (``_torchrun_main``).
* A worker that dies otherwise (a signal: ``kill -9``, the OOM killer; a crash) is told in a few lines: which one,
  how, that the others were stopped, where the logs are and the command that resumes; torchrun's log lines and
  summary and the tracebacks go into the run's launch.log, not onto the console (``worker_failure.py``).

Nothing here imports torch until torchrun's process runs: parsing ``sanlab``'s command line stays quick.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sanlab.errors import SanlabError

# a directory the launcher makes for one launch, named in the environment of torchrun and its workers
LAUNCH_DIR_ENV = "SANLAB_LAUNCH_DIR"
# the launcher's pid, for torchrun's process (``die_with_parent``)
PARENT_ENV = "SANLAB_LAUNCH_PARENT"
ERROR_FILE = "error"  # a worker's sanlab error message (the first worker's, if several fail)
SIGNAL_FILE = "signal"  # the launcher forwarded a signal (so it lives on: ``_remove_if_orphaned``)
# SIGHUP: a closed terminal (torchrun, in its own session, hears nothing of it), handled as torchrun handles it
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# torchrun's process: torch's own launcher run through ``_torchrun_main`` below (tests put a stub script here)
TORCHRUN = (sys.executable, "-m", "sanlab.training.launch")


def torchrun_command(args) -> list[str]:
    """``sanlab train``'s arguments as a torchrun command for ``args.nproc`` processes on this machine."""
    command = [*TORCHRUN, "--standalone", f"--nproc_per_node={args.nproc}", "-m", "sanlab", "train", args.config,
               "--run-dir", args.run]
    command += [x for o in args.overrides for x in ("--set", o)] + (["--device", args.device] if args.device else [])
    command += ["--stop-after", args.stop_after] if args.stop_after else []
    command += [flag for flag, on in (("--overwrite", args.overwrite), ("--quiet", args.quiet),
                                      ("--allow-changed-data", args.allow_changed_data)) if on]
    return command


def launch(command: list[str], args=None) -> int:
    """Run ``command`` (torchrun) to its end and return its exit status. Raises KeyboardInterrupt when a SIGINT
    was forwarded to it (the CLI says "interrupted" once), and a worker's sanlab error as a SanlabError with the
    worker's message. SIGTERM and SIGHUP (a closed terminal): forwarded, and the status is 128 + the signal, as for
    a process that signal ended. Only the first signal is forwarded, and it decides; if torchrun had already ended
    with status 0 when it came, the run finished: 0. A process that died otherwise (a signal of its own, a crash) is
    told in a few lines (``worker_failure.account``, for ``sanlab train``'s parsed ``args``), the long text kept in
    the run's launch.log: torchrun's status, 1."""
    received: list[int] = []  # the first signal that came
    sent = False  # whether torchrun has it
    child: subprocess.Popen | None = None
    where = Path(tempfile.mkdtemp(prefix="sanlab-launch-"))
    keep = False  # a failed launch's log kept in ``where`` (no run directory to keep it in)
    try:
        def forward(signum, frame) -> None:
            nonlocal sent
            if received:  # only the first, of any kind: a second Ctrl-C, or a scheduler's SIGTERM after one, would
                return  # cut torchrun's shutdown of its workers short, leaving them running (it ends them with
                # SIGKILL itself if they take over 30 s)
            Path(where, SIGNAL_FILE).write_text(signal.Signals(signum).name)
            received.append(signum)
            if child is not None:
                sent = True
                with contextlib.suppress(ProcessLookupError):  # (it may have just ended)
                    os.kill(child.pid, signum)

        before = {}
        with contextlib.suppress(ValueError):  # (outside the main thread no handler can be set: nothing forwarded)
            for sig in FORWARDED:
                if signal.getsignal(sig) != signal.SIG_IGN:  # (nohup's SIGHUP, a background job's SIGINT: kept)
                    before[sig] = signal.signal(sig, forward)
        try:
            env = {**os.environ, LAUNCH_DIR_ENV: str(where), PARENT_ENV: str(os.getpid())}
            # torchrun's log directory (its workers' error files), removed with this one: by default torchrun makes
            # a /tmp/torchelastic_* of its own and leaves it behind (a user's --log-dir, PET_LOG_DIR, is kept)
            env.setdefault("PET_LOG_DIR", str(Path(where, "torchrun")))
            # torchrun sets 1 itself when unset, with a four-line warning at every launch; train.threads still sets
            # each process's threads (a user's own OMP_NUM_THREADS is kept)
            env.setdefault("OMP_NUM_THREADS", "1")
            child = subprocess.Popen(command, env=env, start_new_session=True)
            # a signal that came before torchrun had a pid: the handler could not send it. Only the first signal's
            # handler sends, and only once ``child`` is set; so here either it has sent (``sent``), or it ran
            # before and this sends, or it has not run yet (``received`` is empty) and will send
            if received and not sent:
                sent = True
                os.kill(child.pid, received[0])
            status = child.wait()
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)
        message = _read(Path(where, ERROR_FILE))
        if status != 0 and not received and args is not None:
            keep = _tell_the_failure(where, args, status, told=message is not None)
    finally:
        if not keep:
            shutil.rmtree(where, ignore_errors=True)
    if received and status != 0:
        if received[0] == signal.SIGINT:
            raise KeyboardInterrupt
        return 128 + received[0]
    if message is not None and status != 0:
        raise SanlabError(message)
    return status


def _tell_the_failure(where: Path, args, status: int, *, told: bool = False) -> bool:
    """Print the account of a launch whose process died (``worker_failure``) and keep its long text. ``told``: a
    worker told a sanlab error, which the CLI prints; the long text is kept only where a process crashed beside it
    (its traceback). True where that text stays in the launch directory ``where`` (no run directory to keep it)."""
    from sanlab.training import worker_failure as wf

    run = Path(args.run)
    path = wf.log_path(where, run)
    failure = wf.read_failure(where)
    if told:  # (a process that lost its peer when the one with the error ended is no crash)
        texts = [p.read_text(encoding="utf-8", errors="replace")
                 for p in where.glob(wf.TRACEBACK_FILE.format(rank="*"))]
        if not any(text.strip() and not wf.LOST_PEER.search(text) for text in texts):  # (each worker makes one)
            return False
        lines = [f"sanlab train: a process crashed beside this error; the tracebacks: {path}"]
    elif failure is not None:
        lines = wf.account(*failure, nproc=args.nproc, run=run, log=path, rerun=wf.rerun_command(args))
    elif (where / wf.LOG_FILE).exists():  # torchrun itself failed (its traceback is on the console)
        lines = [f"sanlab train: torchrun ended with status {status}; its log: {path}"]
    else:
        return False
    kept = wf.keep_log(path, where, lines)
    if kept != path:
        lines.append(f"sanlab train: ({path} could not be written: the logs are in {kept})")
    print("\n".join(lines), file=sys.stderr)
    return kept.is_relative_to(where)


def launched() -> bool:
    """Whether this process is a worker of ``launch`` (its launcher reports errors and interruptions)."""
    return LAUNCH_DIR_ENV in os.environ and "WORLD_SIZE" in os.environ


def tell_launcher(message: str) -> bool:
    """A worker's sanlab error for its launcher to print (the first worker's wins: the others' are most often the
    same error, told them by process 0). False where no launcher listens, or the file cannot be written: then the
    worker prints it itself."""
    if not launched():
        return False
    try:
        fd = os.open(Path(os.environ[LAUNCH_DIR_ENV], ERROR_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return True
    except OSError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(message)
    return True


# how long a worker stopped by another's failure waits for torchrun to end it (``stand_by``)
STAND_BY_S = 60.0


def stand_by(message: str, *, crash: bool) -> None:
    """A worker stopped by another process's failure (``training.distributed``'s RelayedError or RelayedCrash) waits
    for torchrun to end it. torchrun ends every worker once one has exited with an error, and its summary names the
    first: exiting at once raced the failed process, still unwinding (releasing the run's lock, removing a run it had
    just begun) and about to write its message or traceback, which torchrun could then end before it had. Where
    torchrun has not ended this worker within STAND_BY_S (the failed process hangs, or is on another node), a
    relayed sanlab error is told to the launcher (unless the failed process told it first), and the worker ends."""
    time.sleep(STAND_BY_S)
    if not crash:
        tell_launcher(message)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8") or None
    except OSError:  # (none written: no sanlab error)
        return None


def die_with_parent(parent: int) -> None:
    """Linux: the kernel sends this process SIGTERM when its parent ``parent`` dies, however it dies (``kill``, the
    OOM killer), so no orphan goes on training a run (a grid's cell, a torchrun launch) that a rerun would then
    find locked. A checkpoint being written is not damaged (they are renamed into place) and the run's lock goes
    with the process. (The kernel signals when the thread that started this process ends: start it from a
    thread that lives as long as the parent, its main thread.)"""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGTERM) != 0:  # 1 = PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):  # not Linux: children outlive a killed parent there
        return
    if os.getppid() != parent:  # the parent died before the request: nothing will signal
        os._exit(1)


class _NotOnTheConsole(logging.Filter):
    """Leaves torchrun's agent's log lines (``torch.distributed.elastic``: "failed (exitcode: 2)", "Sending process
    ... closing signal", "Received SIGINT death signal") off the console under the launcher, which says what
    happened; they go into the launch's log (``worker_failure.TorchrunLog``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.name.startswith("torch.distributed.elastic")


def _torchrun_main(argv: list[str]) -> int:
    """torchrun's process: ``torch.distributed.run`` with ``argv``, which ends quietly (status 2) when a worker
    told the launcher a sanlab error, or 128 + the signal forwarded to it; any other failure as torchrun says it."""
    if PARENT_ENV in os.environ:
        die_with_parent(int(os.environ[PARENT_ENV]))
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    where = Path(os.environ[LAUNCH_DIR_ENV]) if LAUNCH_DIR_ENV in os.environ else None  # (None: run by hand)
    log = None
    if where is not None:
        from sanlab.training.worker_failure import TorchrunLog, write_failure

        quiet = _NotOnTheConsole()
        for name in ("torch.distributed", "torch", ""):  # where torch's loggers have their handlers
            for handler in logging.getLogger(name).handlers:
                handler.addFilter(quiet)
        log = TorchrunLog(where)
        logging.getLogger("torch.distributed.elastic").addHandler(log.handler)
    try:
        torchrun(argv)
    except ChildFailedError as err:
        if where is None:
            raise
        told = _read(where / ERROR_FILE) is not None  # a worker's sanlab error, which the launcher prints
        try:
            write_failure(where, err, log.stopped)  # the launcher tells the rest
        except Exception:
            if not told:  # (torchrun's own account then, rather than none)
                raise err from None
        return 2 if told else 1
    except SignalException as err:
        if where is not None and PARENT_ENV in os.environ:
            _remove_if_orphaned(where, int(os.environ[PARENT_ENV]))
        return 128 + int(err.sigval)
    return 0


def _remove_if_orphaned(where: Path, parent: int, wait_s: float = 2.0) -> None:
    """Remove the launch directory ``where`` once the launcher ``parent`` is gone: killed outright (the OOM killer,
    ``kill -9``), it left the directory in /tmp, and its death is the SIGTERM that stopped torchrun here. A signal the
    launcher forwarded (it wrote SIGNAL_FILE first) leaves the directory to the launcher, which lives on. The kernel
    may signal before this process is handed to its new parent, and again once it is (a launcher with threads): the
    second is ignored while this waits ``wait_s`` for that (torchrun's handler would raise it here)."""
    if (where / SIGNAL_FILE).exists():
        return
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_IGN)
    deadline = time.monotonic() + wait_s
    while os.getppid() == parent:
        if time.monotonic() > deadline:
            return  # (someone else's signal, the launcher alive: it removes the directory)
        time.sleep(0.02)
    shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(_torchrun_main(sys.argv[1:]))
