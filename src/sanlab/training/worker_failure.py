"""What ``sanlab train --nproc N`` says when one of its processes dies: killed by a signal (``kill -9``, the kernel's
out-of-memory killer), crashing with a Python exception, or exiting with an error status.

torchrun's own account of such a death ran to some 110 lines: the surviving process's gloo traceback ("Connection
reset by peer", which names the wrong process), torchrun's log lines and its "Failures:" summary, which names the
processes torchrun stopped itself beside the one that died. Instead the console now gets a few lines
(``account``): which process died and how, that the others were stopped, where the logs are and the command that
resumes; the long text (each process's traceback, torchrun's lines and summary) goes into the run's ``launch.log``.

Three processes take part. A worker's uncaught exception and a fatal signal's stack are written into a file of the
launch directory instead of its stderr (``keeping_tracebacks``). torchrun's process, on torchrun's
``ChildFailedError``, tells which processes failed of themselves (``own_failures``) and writes them
(``FAILURE_FILE``) with the long text (``LOG_FILE``). The launcher prints the account and keeps the long text
(``keep_log``).
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import shlex
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from sanlab.training.layout import RunLayout

FAILURE_FILE = "failure.json"  # torchrun's process: the processes that failed (``Failure``), those it stopped
LOG_FILE = "torchrun.log"  # torchrun's process: its log lines, its summary, tracebacks no error file holds
TRACEBACK_FILE = "traceback-{rank}"  # a worker's uncaught exception, as Python would have printed it

# gloo's and NCCL's words for a collective whose peer went away: a process failing so failed because another died
LOST_PEER = re.compile(r"Connection (reset|closed) by peer|remote process exited|NCCL communicator was aborted")


@dataclass(frozen=True)
class Failure:
    """One process of the launch that failed, as torchrun saw it."""

    rank: int
    pid: int
    exitcode: int  # negative: the signal that ended it
    error: str = ""  # its exception's message ("RuntimeError: ..."), "" where it left none (a signal)
    where: str = ""  # the innermost frame of its traceback outside torch and Python ("train.py, line 4, in f")

    def how(self) -> str:
        """How it ended, in a few words: "was killed by SIGKILL (signal 9) ...", "failed: TYPE: MESSAGE (where)"."""
        if self.error:
            lines = self.error.strip().splitlines() or [""]
            said = lines[0] + (" [...]" if len(lines) > 1 else "")
            return f"failed: {said}" + (f" ({self.where})" if self.where else "")
        if self.exitcode < 0:
            try:
                name = signal.Signals(-self.exitcode).name
            except ValueError:
                return f"was killed by signal {-self.exitcode}"
            hint = ", from `kill -9` or the kernel's out-of-memory killer (see `dmesg`)" if name == "SIGKILL" else ""
            return f"was killed by {name} (signal {-self.exitcode}){hint}"
        return f"exited with status {self.exitcode}"


def own_failures(failures: list[Failure], stopped: set[int]) -> list[Failure]:
    """The processes that failed of themselves: not those torchrun stopped once it saw a failure (``stopped``: their
    pids; they end with SIGTERM, or with the error they were raising when it came), nor those whose collective lost
    its peer (gloo's "Connection reset by peer" names the survivor, not the dead). Where that leaves none (a
    process ended by someone's SIGTERM, its peers by torchrun's), those torchrun did not stop, or all."""
    own = [f for f in failures if f.pid not in stopped and not LOST_PEER.search(f.error)]
    return own or [f for f in failures if f.pid not in stopped] or list(failures)


def innermost_frame(callstack: str, library) -> str:
    """The innermost frame of a Python traceback whose file is not ``library``'s (a predicate on a file name: torch's
    and Python's own files, where the frame that called them is the one to look at), as "FILE, line N, in
    FUNCTION"; "" if none."""
    frames = re.findall(r'^\s*File "([^"]+)", line (\d+), in (\S+)', callstack, flags=re.MULTILINE)
    for file, line, function in reversed(frames):
        if not file.startswith("<") and not library(file):
            return f"{file}, line {line}, in {function}"
    return ""


# ---------------------------------------------------------------------------------------------- a worker
def keeping_tracebacks(main, where: Path, rank: str):
    """``main`` for a worker of the launcher (called inside torchrun's ``record``, which enables faulthandler on
    stderr): its uncaught exception's traceback (``sys.excepthook``) and a fatal signal's stack (faulthandler) go
    into a file of the launch directory ``where``, not onto the console; torchrun's process puts what its error file
    lacks into launch.log. Printed as usual if that file cannot be opened."""
    def run(*args, **kwargs):
        try:
            kept = open(where / TRACEBACK_FILE.format(rank=rank), "a", encoding="utf-8")  # (open until the end)
        except OSError:
            return main(*args, **kwargs)

        def hook(kind, value, tb) -> None:
            kept.write("".join(traceback.format_exception(kind, value, tb)))
            kept.flush()

        faulthandler.enable(file=kept, all_threads=True)
        sys.excepthook = hook
        return main(*args, **kwargs)
    return run


# ---------------------------------------------------------------------------------------------- torchrun's process
class TorchrunLog:
    """A logging handler for torchrun's agent's records (``torch.distributed.elastic``) under the launcher: they go
    into LOG_FILE, not onto the console, and it notes the processes torchrun stopped itself ("Sending process PID
    closing signal SIGTERM")."""

    CLOSING = ("Sending process %s closing signal %s", "Closing process %s via signal %s")

    def __init__(self, where: Path):
        import logging

        class Handler(logging.Handler):
            def emit(handler, record: logging.LogRecord) -> None:
                if record.msg in self.CLOSING and record.args:
                    self.stopped.add(int(record.args[0]))
                try:
                    with open(where / LOG_FILE, "a", encoding="utf-8") as out:
                        out.write(handler.format(record) + "\n")
                except OSError:
                    pass

        self.stopped: set[int] = set()
        self.handler = Handler()
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))


def write_failure(where: Path, err, stopped: set[int]) -> None:
    """torchrun's ``ChildFailedError`` ``err`` into the launch directory ``where``: the processes that failed of
    themselves and those it stopped (FAILURE_FILE), its summary with their tracebacks and the tracebacks its error
    files lack (LOG_FILE)."""
    library = _library()
    failures, lacking = [], []
    for rank, failure in sorted(err.failures.items()):
        message = failure.message if isinstance(failure.message, dict) else {}
        callstack = message.get("extraInfo", {}).get("py_callstack", "")
        kept = where / TRACEBACK_FILE.format(rank=rank)
        if not callstack and kept.exists():  # an exception outside torchrun's ``record``, a fatal signal's stack
            callstack = kept.read_text(encoding="utf-8", errors="replace")
            if callstack.strip():  # (every worker makes its file as it starts)
                lacking.append((rank, callstack))
        python = callstack.startswith("Traceback (most recent call last)")  # (not faulthandler's dump)
        error = message.get("message", "") or (_last_line(callstack) if python and failure.exitcode > 0 else "")
        failures.append(Failure(rank=rank, pid=failure.pid, exitcode=failure.exitcode, error=error,
                                where=innermost_frame(callstack, library) if python else ""))
    own = own_failures(failures, stopped)
    record = {"failed": [asdict(f) for f in own], "stopped": [f.rank for f in failures if f not in own]}
    with open(where / LOG_FILE, "a", encoding="utf-8") as out:
        out.write(err.format_msg() + "\n")
        for rank, callstack in lacking:
            out.write(f"process {rank}'s traceback (no error file of torchrun's holds it):\n{callstack}\n")
    (where / FAILURE_FILE).write_text(json.dumps(record), encoding="utf-8")


def _library():
    """Whether a file is torch's or Python's standard library's (not the installed packages beside it, sanlab's)."""
    import sysconfig

    import torch

    paths = sysconfig.get_paths()
    torch_dir = os.path.join(os.path.dirname(torch.__file__), "")
    stdlib = os.path.join(paths["stdlib"], "")
    packages = tuple(os.path.join(paths[k], "") for k in ("purelib", "platlib"))
    return lambda file: file.startswith(torch_dir) or (file.startswith(stdlib) and not file.startswith(packages))


def _last_line(callstack: str) -> str:
    lines = [line for line in callstack.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


# ---------------------------------------------------------------------------------------------- the launcher
def read_failure(where: Path) -> tuple[list[Failure], list[int]] | None:
    """What torchrun's process wrote (``write_failure``): the failed processes and the ranks it stopped; None where
    it wrote nothing."""
    try:
        record = json.loads((where / FAILURE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return [Failure(**f) for f in record["failed"]], list(record["stopped"])


def rerun_command(args) -> str:
    """The command that resumes the run ``args`` launched: the same, without ``--overwrite`` (which would delete
    the checkpoints to resume from)."""
    command = ["sanlab", "train", args.config, "--run", args.run, "--nproc", str(args.nproc)]
    command += [x for o in args.overrides for x in ("--set", o)] + (["--device", args.device] if args.device else [])
    command += ["--stop-after", args.stop_after] if args.stop_after else []
    command += [flag for flag, on in (("--quiet", args.quiet), ("--allow-changed-data", args.allow_changed_data)) if on]
    return shlex.join(command)


def _processes(ranks: list[int]) -> str:
    return f"process {ranks[0]}" if len(ranks) == 1 else f"processes {', '.join(map(str, ranks))}"


def account(failed: list[Failure], stopped: list[int], *, nproc: int, run: Path, log: Path, rerun: str,
            command: str = "train") -> list[str]:
    """The console's lines for a launch whose processes ``failed`` (the others ``stopped``)."""
    lines = [f"sanlab {command}: error: process {f.rank} of {nproc} (pid {f.pid}) {f.how()}" for f in failed]
    others = sorted(set(range(nproc)) - {f.rank for f in failed})
    if others:
        lines.append(f"sanlab {command}: {_processes(others)} {'was' if len(others) == 1 else 'were'} stopped too "
                     "(the checkpoints written so far are intact)")
    train_log = RunLayout(run).train_log
    logs = f"{train_log}; tracebacks and torchrun's account: {log}" if train_log.exists() else (
        f"tracebacks and torchrun's account: {log}")
    lines.append(f"sanlab {command}: log: {logs}")
    written = RunLayout(run).checkpoints.is_dir() and any(RunLayout(run).checkpoints.glob("step-*"))
    again = "to resume from the last checkpoint" if written else "to start again (no checkpoint was written)"
    lines.append(f"sanlab {command}: {again}: {rerun}")
    return lines


def log_path(where: Path, run: Path) -> Path:
    """Where the long text of a failed launch goes: the run's launch.log where ``run`` is a run directory this
    process may write into, else launch.log in the launch directory ``where`` (which the launcher then keeps)."""
    kept = RunLayout(run).launch_log
    return kept if RunLayout(run).meta.exists() and os.access(run, os.W_OK) else where / kept.name


def keep_log(path: Path, where: Path, lines: list[str]) -> Path:
    """Append the account ``lines`` and the long text torchrun's process left in ``where`` to ``path``
    (``log_path``); where that cannot be written, to launch.log in ``where``. Returns the file written."""
    text = (where / LOG_FILE).read_text(encoding="utf-8", errors="replace") if (where / LOG_FILE).exists() else ""
    entry = f"==== {time.strftime('%Y-%m-%d %H:%M:%S')}\n" + "".join(line + "\n" for line in lines) + text + "\n"
    for target in dict.fromkeys([path, where / path.name]):
        try:
            with open(target, "a", encoding="utf-8") as out:
                out.write(entry)
            return target
        except OSError:
            continue
    return where / LOG_FILE
