"""What ``sanlab train --nproc N`` says when one of its processes dies (``training/worker_failure.py``): which
process failed of itself, how, and the few lines the console gets; a real ``kill -9`` of one process of a
two-process run (slow). A crash of one process under the launcher: tests/training/test_distributed.py."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sanlab.config import dump_config
from sanlab.training.worker_failure import Failure, account, innermost_frame, own_failures, rerun_command

GLOO_LOST = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
             "[127.0.0.1]:47001: Connection reset by peer. This is typically caused by a remote worker hanging")


def test_the_process_that_died_is_named_not_the_ones_torchrun_stopped_or_that_lost_their_peer():
    """torchrun's summary lists every process it found ended, those it stopped itself (SIGTERM, or the gloo error
    they were raising as it came) beside the one that died, and its "Root Cause" is the earliest by a clock of
    whole seconds: a race. The one named is the one that failed of itself."""
    killed = Failure(rank=1, pid=11, exitcode=-9)
    stopped = Failure(rank=0, pid=10, exitcode=-15, error=GLOO_LOST)
    assert own_failures([stopped, killed], stopped={10}) == [killed]
    # the survivor's collective failed and it exited before torchrun saw the death: still not named
    survivor = Failure(rank=0, pid=10, exitcode=1, error=GLOO_LOST)
    assert own_failures([survivor, killed], stopped=set()) == [killed]
    crashed = Failure(rank=1, pid=11, exitcode=1, error="RuntimeError: a bug")
    assert own_failures([crashed, Failure(rank=0, pid=10, exitcode=-15)], stopped={10}) == [crashed]
    # a process ended by someone's SIGTERM, the other by torchrun's: the first
    term = Failure(rank=2, pid=12, exitcode=-15)
    assert own_failures([Failure(rank=0, pid=10, exitcode=-15), term], stopped={10}) == [term]
    assert own_failures([survivor], stopped=set()) == [survivor]  # nothing else to name


def test_how_a_process_ended_is_said_in_one_line():
    assert Failure(1, 11, -9).how() == ("was killed by SIGKILL (signal 9), from `kill -9` or the kernel's "
                                        "out-of-memory killer (see `dmesg`)")
    assert Failure(1, 11, -11).how() == "was killed by SIGSEGV (signal 11)"
    assert Failure(1, 11, -200).how() == "was killed by signal 200"
    assert Failure(1, 11, 3).how() == "exited with status 3"
    assert Failure(1, 11, 1, error="RuntimeError: rank 1 fails\nits second line",
                   where="train.py, line 4, in step").how() == "failed: RuntimeError: rank 1 fails [...] (train.py, " \
                                                               "line 4, in step)"


def test_the_frame_named_is_the_innermost_outside_torch_and_python():
    callstack = ('Traceback (most recent call last):\n'
                 '  File "/src/sanlab/cli.py", line 338, in main\n    return args.fn(args)\n'
                 '  File "/src/sanlab/training/loop.py", line 254, in update\n    loss.backward()\n'
                 '  File "/venv/torch/_tensor.py", line 623, in backward\n    torch.autograd.backward(\n'
                 'RuntimeError: bad\n')
    assert innermost_frame(callstack, lambda f: f.startswith("/venv/torch/")) == ("/src/sanlab/training/loop.py, "
                                                                                 "line 254, in update")
    assert innermost_frame(callstack, lambda f: True) == ""


def test_torch_and_pythons_library_are_skipped_not_the_packages_installed_beside_them():
    """In python's Docker images the packages lie inside the standard library's directory
    (/usr/local/lib/python3.11/site-packages): sanlab installed there is no library frame."""
    import sysconfig

    import torch

    from sanlab.training import worker_failure

    library = worker_failure._library()
    assert library(torch.nn.functional.__file__) and library(json.__file__)
    assert not library(worker_failure.__file__)
    assert not library(os.path.join(sysconfig.get_paths()["purelib"], "sanlab", "cli.py"))


def _args(**given) -> argparse.Namespace:
    defaults = dict(config="configs/x.yaml", run="runs/a b", nproc=2, overrides=[], device=None, overwrite=False,
                    quiet=False, allow_changed_data=False, stop_after=None)
    return argparse.Namespace(**{**defaults, **given})


def test_the_rerun_command_is_the_launch_without_overwrite():
    """--overwrite would delete the checkpoints the rerun resumes from."""
    args = _args(overrides=["train.lr=2e-4"], device="cpu", overwrite=True, quiet=True)
    assert rerun_command(args) == ("sanlab train configs/x.yaml --run 'runs/a b' --nproc 2 --set train.lr=2e-4 "
                                   "--device cpu --quiet")


def test_the_rerun_command_and_the_torchrun_command_keep_the_sessions_limit():
    """--stop-after is the invocation's: the rerun is bounded as the launch was, and so are torchrun's workers (their
    deadline comes from the launcher's environment, the text for their messages)."""
    from sanlab.training.launch import torchrun_command

    args = _args(stop_after="9m")
    assert rerun_command(args).endswith("--nproc 2 --stop-after 9m")
    command = torchrun_command(args)
    assert command[command.index("--stop-after") + 1] == "9m"


def test_the_account_names_the_dead_the_stopped_the_logs_and_the_command(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text("{}")
    (run / "train.log").write_text("")
    (run / "checkpoints" / "step-00000002").mkdir(parents=True)
    lines = account([Failure(2, 12, -9)], [0, 1, 3], nproc=4, run=run, log=run / "launch.log",
                    rerun="sanlab train c.yaml --run run --nproc 4")
    assert lines == [
        "sanlab train: error: process 2 of 4 (pid 12) was killed by SIGKILL (signal 9), from `kill -9` or the "
        "kernel's out-of-memory killer (see `dmesg`)",
        "sanlab train: processes 0, 1, 3 were stopped too (the checkpoints written so far are intact)",
        f"sanlab train: log: {run / 'train.log'}; tracebacks and torchrun's account: {run / 'launch.log'}",
        "sanlab train: to resume from the last checkpoint: sanlab train c.yaml --run run --nproc 4"]
    gone = tmp_path / "gone"  # a run whose start failed and was taken back: nothing to resume from
    lines = account([Failure(0, 10, 1, error="KeyError: 'x'")], [1], nproc=2, run=gone, log=tmp_path / "l.log",
                    rerun="sanlab train c.yaml --run gone --nproc 2")
    assert lines[2:] == [f"sanlab train: log: tracebacks and torchrun's account: {tmp_path / 'l.log'}",
                         "sanlab train: to start again (no checkpoint was written): sanlab train c.yaml --run gone "
                         "--nproc 2"]


def _steps(run: Path) -> list[int]:
    try:
        text = (run / "metrics.jsonl").read_text()
    except OSError:
        return []
    return [json.loads(line)["step"] for line in text.splitlines() if line.endswith("}")]


def _worker(parent: int, rank: int) -> int | None:
    """The pid of torchrun's worker ``rank`` among the descendants of ``parent`` (Linux's /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    todo = list(children.get(parent, []))
    while todo:
        pid = todo.pop()
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"TORCHELASTIC_RUN_ID" in b" ".join(environ):
            return pid
        todo += children.get(pid, [])
    return None


@pytest.mark.slow  # a two-process run (~20 s)
def test_a_killed_process_is_told_in_a_few_lines_and_its_tracebacks_kept_in_launch_log(tmp_path, tiny_translation):
    """`kill -9` of process 1 mid-training printed ~110 lines: process 0's gloo "Connection reset by peer" traceback
    (naming the survivor) and torchrun's log lines and summary. Now: which process died and how, that the other was
    stopped, where the logs are, and the command that resumes; torchrun's account and the tracebacks in launch.log."""
    if not sys.platform.startswith("linux"):
        pytest.skip("finds the worker's pid in Linux's /proc")
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=100_000, valid_every=2, log_every=1, threads=1)))
    run, temp = tmp_path / "run", tmp_path / "temp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    launcher = subprocess.Popen([sys.executable, "-m", "sanlab", "train", str(config), "--run", str(run), "--nproc",
                                 "2", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**env, "TMPDIR": str(temp)})
    try:
        deadline = time.monotonic() + 600
        while max(_steps(run), default=0) < 3:  # a checkpoint (update 2) written, training on
            assert launcher.poll() is None, launcher.communicate()[1]
            assert time.monotonic() < deadline, "the run never reached update 3"
            time.sleep(0.05)
        rank_1 = _worker(launcher.pid, 1)
        assert rank_1 is not None
        os.kill(rank_1, signal.SIGKILL)
        err = launcher.communicate(timeout=600)[1]
    finally:
        launcher.kill()
        launcher.communicate()
    assert launcher.returncode == 1, err
    said = err.splitlines()  # (nothing of torchrun's own: the launcher gives it OMP_NUM_THREADS, so it warns not)
    assert said == [
        f"sanlab train: error: process 1 of 2 (pid {rank_1}) was killed by SIGKILL (signal 9), from `kill -9` or the "
        "kernel's out-of-memory killer (see `dmesg`)",
        "sanlab train: process 0 was stopped too (the checkpoints written so far are intact)",
        f"sanlab train: log: {run / 'train.log'}; tracebacks and torchrun's account: {run / 'launch.log'}",
        f"sanlab train: to resume from the last checkpoint: sanlab train {config} --run {run} --nproc 2 --quiet"], err
    log = (run / "launch.log").read_text()
    assert said[0] in log and "Root Cause" in log and f"exitcode  : -9 (pid: {rank_1})" in log, log
    assert [p for p in temp.iterdir() if not _torchs_own_temp(p)] == []
    assert any((run / "checkpoints").glob("step-*"))


def _torchs_own_temp(path: Path) -> bool:
    """What torch itself leaves in TMPDIR when a process is killed: inductor's cache, and on older releases (2.5.1,
    not 2.13.0) the directory that torch.distributed.nn.jit.instantiator creates when DDP is first built (a
    ``tempfile.TemporaryDirectory`` removed at a normal exit, which a process killed by SIGKILL never reaches)."""
    return path.name.startswith("torchinductor_") or (
        path.name.startswith("tmp") and [p.name for p in path.iterdir()] == ["_remote_module_non_scriptable.py"])


def test_the_long_text_is_appended_to_the_runs_launch_log_or_kept_in_the_launch_folder(tmp_path, capsys):
    """What torchrun's process wrote goes, below the account, into the run's launch.log (appended: a run may fail
    more than once), and the launch folder can go; without a run directory (a start that failed before making it)
    it stays in the launch folder, which the launcher then keeps, and the account names it."""
    from sanlab.training import launch, worker_failure

    def failed_launch(name: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        (where / worker_failure.FAILURE_FILE).write_text(json.dumps(
            {"failed": [{"rank": 1, "pid": 11, "exitcode": -9, "error": "", "where": ""}], "stopped": [0]}))
        (where / worker_failure.LOG_FILE).write_text("torchrun's summary\n")
        return where

    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text("{}")
    for attempt in ("a", "b"):
        assert launch._tell_the_failure(failed_launch(attempt), _args(run=str(run)), 1) is False
    err = capsys.readouterr().err
    assert err.count("sanlab train: error: process 1 of 2 (pid 11) was killed by SIGKILL") == 2, err
    log = (run / "launch.log").read_text()
    assert log.count("torchrun's summary") == 2 and log.count("was killed by SIGKILL") == 2, log
    where = failed_launch("c")
    assert launch._tell_the_failure(where, _args(run=str(tmp_path / "none")), 1) is True
    assert f"tracebacks and torchrun's account: {where / 'launch.log'}" in capsys.readouterr().err
    assert "torchrun's summary" in (where / "launch.log").read_text() and not (tmp_path / "none").exists()


def test_a_crash_beside_a_sanlab_error_keeps_its_traceback(tmp_path, capsys):
    """A worker's sanlab error is the command's message (status 2); a process that crashed beside it (its traceback
    in the launch folder, not on the console) has it kept in launch.log, named in one line. Without a crash nothing
    is kept or said."""
    from sanlab.training import launch, worker_failure

    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text("{}")
    where = tmp_path / "launch"
    where.mkdir()
    (where / worker_failure.LOG_FILE).write_text("torchrun's summary\n")
    (where / worker_failure.TRACEBACK_FILE.format(rank=2)).write_text("")  # (each worker makes one as it starts)
    assert launch._tell_the_failure(where, _args(run=str(run)), 2, told=True) is False
    assert capsys.readouterr().err == "" and not (run / "launch.log").exists()
    (where / worker_failure.TRACEBACK_FILE.format(rank=0)).write_text(f"Traceback (most recent call last):\n"
                                                                      f"{GLOO_LOST}\n")  # (no crash: a lost peer)
    assert launch._tell_the_failure(where, _args(run=str(run)), 2, told=True) is False
    assert capsys.readouterr().err == "" and not (run / "launch.log").exists()
    (where / worker_failure.TRACEBACK_FILE.format(rank=1)).write_text("Traceback (most recent call last):\n")
    assert launch._tell_the_failure(where, _args(run=str(run)), 2, told=True) is False
    assert capsys.readouterr().err == (f"sanlab train: a process crashed beside this error; the tracebacks: "
                                       f"{run / 'launch.log'}\n")
    assert "torchrun's summary" in (run / "launch.log").read_text()
