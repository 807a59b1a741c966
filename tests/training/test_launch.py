"""``sanlab train --nproc N``'s launcher (``training/launch.py``), with torchrun replaced by a stub script: signals
reach torchrun, which runs in its own session; torchrun dies with the launcher; a worker's sanlab error ends the
command with its message and status 2. (tests/training/test_distributed.py launches real torchrun jobs.)"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the launch directory (sanlab-launch-*) of a launch in this process goes to the test's own temporary directory,
# which must be left empty of it (tests/training/conftest.py)
pytestmark = pytest.mark.usefixtures("private_tmpdir")

# `sanlab train --nproc 2` with torchrun replaced by the stub (launch.TORCHRUN)
# the launcher, with the signals it forwards handled as a terminal's foreground job has them: this test may run where
# they are ignored (a background job of a non-interactive shell ignores SIGINT: `nohup make test &`), which the
# launcher would inherit and, by design, keep ignored
LAUNCHER = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
from sanlab.training import launch
launch.TORCHRUN = (sys.executable, sys.argv.pop(1))
from sanlab.cli import main
sys.exit(main(sys.argv[1:]))
"""

# torchrun's stand-in: says where it runs, then waits for a signal and writes down which one came. ACTION: what it
# does first (asks for the launcher's death signal, as torchrun's process does; tells the launcher an error)
STUB = """
import os, signal, sys, time
from pathlib import Path
from sanlab.training import launch

out = Path(os.environ["STUB_OUT"])
def stop(signum, frame):
    (out / "signal").write_text(signal.Signals(signum).name)
    sys.exit(128 + signum)
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, stop)
{action}
(out / "session").write_text(f"{{os.getpid()}} {{os.getsid(0)}}")
time.sleep(120)
"""


def _launch(tmp_path, action: str = "") -> subprocess.Popen:
    stub = tmp_path / "torchrun.py"
    stub.write_text(STUB.format(action=action))
    recipe = tmp_path / "c.yaml"
    recipe.write_text("task: tagging\ndata: {train: a, dev: b}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env["TMPDIR"] = str(tmp_path)  # the launch directory: a launcher killed here leaves it (not in /tmp)
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, str(stub), "train", str(recipe), "--run",
                             str(tmp_path / "run"), "--nproc", "2"], stderr=subprocess.PIPE, text=True,
                            env={**env, "STUB_OUT": str(tmp_path)})


def _wait_for(path, process: subprocess.Popen, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert process.poll() is None or path.exists(), process.communicate()[1]
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.05)
    return path.read_text()


@pytest.mark.slow  # the launcher and its stub torchrun: two python processes (~5 s)
@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_to_the_launcher_reaches_torchrun_in_its_own_session(tmp_path, sig, status):
    """Ctrl-C reaches the terminal's process group: torchrun is not in it (its workers would otherwise get SIGINT
    twice, from the terminal and from torchrun), so the launcher passes the signal on and waits for it; it says
    "interrupted" once, for all processes (it was said once per process)."""
    launcher = _launch(tmp_path)
    pid, session = map(int, _wait_for(tmp_path / "session", launcher).split())
    assert session == pid != os.getsid(launcher.pid)  # a session of its own
    launcher.send_signal(sig)
    err = launcher.communicate(timeout=120)[1]
    assert (tmp_path / "signal").read_text() == sig.name
    assert launcher.returncode == status, err
    assert err.count("interrupted") == (1 if sig == signal.SIGINT else 0), err
    if sig == signal.SIGINT:
        assert "sanlab train: interrupted; rerun the same command to resume" in err


@pytest.mark.slow  # the launcher and its stub torchrun
def test_torchrun_dies_with_its_launcher(tmp_path):
    """A launcher killed outright (SIGKILL, the OOM killer) forwards nothing: the kernel sends torchrun's process
    SIGTERM (``die_with_parent``, which torchrun passes on to its workers), so no orphan trains on."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    launcher = _launch(tmp_path, action="launch.die_with_parent(int(os.environ[launch.PARENT_ENV]))")
    _wait_for(tmp_path / "session", launcher)
    launcher.kill()
    launcher.communicate(timeout=120)
    assert _wait_for(tmp_path / "signal", launcher) == "SIGTERM"


# torchrun's process as the launcher runs it (``_torchrun_main``), torch's launcher replaced by a wait for a signal,
# which it turns into a SignalException as torch's does
TORCHRUN_MAIN = """
import os, signal, sys, time
from pathlib import Path
import torch.distributed.run
from torch.distributed.elastic.multiprocessing import SignalException
from sanlab.training import launch

def waits(argv):
    def stop(signum, frame):
        raise SignalException("stopped", sigval=signal.Signals(signum))
    signal.signal(signal.SIGTERM, stop)
    Path(os.environ["STUB_OUT"], "session").write_text(f"{os.getpid()} {os.getsid(0)}")
    time.sleep(120)
torch.distributed.run.main = waits
sys.exit(launch._torchrun_main(sys.argv[1:]))
"""


@pytest.mark.slow  # the launcher and torchrun's process (which imports torch)
def test_a_killed_launchers_directory_is_removed_by_torchruns_process(tmp_path):
    """The launcher killed outright cannot remove its launch directory (/tmp/sanlab-launch-*): one was left behind
    by every OOM-killed launch. torchrun's process, ended by the launcher's death, removes it."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    temp = tmp_path / "temp"
    temp.mkdir()
    stub = tmp_path / "torchrun_main.py"
    stub.write_text(TORCHRUN_MAIN)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    (tmp_path / "c.yaml").write_text("task: tagging\ndata: {train: a, dev: b}\n")
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(stub), "train", str(tmp_path / "c.yaml"),
                                 "--run", str(tmp_path / "run"), "--nproc", "2"], stderr=subprocess.PIPE, text=True,
                                env={**env, "STUB_OUT": str(tmp_path), "TMPDIR": str(temp)})
    pid = int(_wait_for(tmp_path / "session", launcher).split()[0])
    assert [p.name.startswith("sanlab-launch-") for p in temp.iterdir()] == [True]
    launcher.kill()
    launcher.communicate(timeout=120)
    deadline = time.monotonic() + 120
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    assert list(temp.iterdir()) == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] != "Z"  # (a zombie has ended)


@pytest.mark.slow  # the launcher and its stub torchrun
def test_a_workers_sanlab_error_ends_the_launch_with_its_message_and_status_2(tmp_path):
    """What a worker tells the launcher (the first worker: a second one's message is dropped) is printed as
    one process's error would be, and the command ends with status 2 whatever torchrun's status."""
    action = ("os.environ['WORLD_SIZE'] = '2'\n"
              "assert launch.tell_launcher('data.train: a: no such file') and launch.tell_launcher('another')\n"
              "sys.exit(1)")
    launcher = _launch(tmp_path, action=action)
    err = launcher.communicate(timeout=120)[1]
    assert launcher.returncode == 2
    assert err.strip().splitlines()[-1] == "sanlab train: error: data.train: a: no such file", err
    assert "another" not in err


@pytest.mark.slow  # the launcher and its stub torchrun: two python processes (~5 s)
@pytest.mark.parametrize("given, seen", [(None, "1"), ("3", "3")])
def test_torchrun_gets_omp_num_threads_so_it_prints_no_warning_and_a_users_value_is_kept(tmp_path, monkeypatch,
                                                                                         given, seen):
    """Unset, torchrun set OMP_NUM_THREADS=1 itself with a four-line warning at every launch."""
    if given is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", given)
    launcher = _launch(tmp_path, action="(out / 'omp').write_text(os.environ.get('OMP_NUM_THREADS', 'unset'))\n"
                                        "sys.exit(1)")
    launcher.communicate(timeout=120)
    assert (tmp_path / "omp").read_text() == seen


def test_without_a_launcher_a_worker_prints_its_own_error(monkeypatch):
    from sanlab.training import launch

    monkeypatch.delenv(launch.LAUNCH_DIR_ENV, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")  # (a worker of torchrun started by hand)
    assert not launch.launched() and not launch.tell_launcher("a message")


@pytest.mark.slow  # the launcher and its stub torchrun
def test_a_failure_that_is_not_a_sanlab_error_keeps_torchruns_status(tmp_path):
    launcher = _launch(tmp_path, action="sys.exit(1)")
    err = launcher.communicate(timeout=120)[1]
    assert launcher.returncode == 1 and "error" not in err, err


@pytest.mark.slow  # the launcher and its stub torchrun
@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_is_not_passed_on(tmp_path, second):
    """torchrun ends its workers on the first signal (SIGKILL after 30 s); a second one, a Ctrl-C or a scheduler's
    SIGTERM after it, would cut that short and leave them running. The first decides the status. The stub, as
    torchrun ending its workers, writes down each signal and ends only once the test has sent the second one (a
    stub that ended on a timer could end first: nothing tested, or the launcher's own handlers gone)."""
    action = ("def count(signum, frame):\n"
              "    with open(out / 'signals', 'a') as f:\n"
              "        f.write(signal.Signals(signum).name + '\\n')\n"
              "    deadline = time.monotonic() + 120  # (a safety net: the test creates 'sent')\n"
              "    while not (out / 'sent').exists() and time.monotonic() < deadline:\n"
              "        time.sleep(0.05)\n"
              "    sys.exit(130 if (out / 'sent').exists() else 1)\n"
              "for sig in (signal.SIGINT, signal.SIGTERM):\n"
              "    signal.signal(sig, count)")
    launcher = _launch(tmp_path, action=action)
    _wait_for(tmp_path / "session", launcher)
    launcher.send_signal(signal.SIGINT)
    _wait_for(tmp_path / "signals", launcher)
    launcher.send_signal(second)
    (tmp_path / "sent").touch()
    err = launcher.communicate(timeout=120)[1]
    assert launcher.returncode == 130 and err.count("interrupted") == 1, err
    assert (tmp_path / "signals").read_text() == "SIGINT\n"


class _Torchrun:
    """subprocess.Popen's stand-in for ``launch`` in this process: ``started`` runs as it starts, ``waiting`` as
    the launcher waits for it, which then gets ``status``."""

    pid = 2**22 + 1  # (no process: os.kill is recorded, not called)

    def __init__(self, started=None, waiting=None, status=0):
        self.started, self.waiting, self.status = started, waiting, status

    def __call__(self, command, **kwargs):
        if self.started:
            self.started()
        return self

    def wait(self):
        if self.waiting:
            self.waiting()
        return self.status


@pytest.fixture
def sent(monkeypatch):
    """The signals ``launch`` sends (os.kill recorded; the tests raise their signals with signal.raise_signal).

    A signal this process was started with ignored stays ignored by design (``launch``: a background job's SIGINT,
    nohup's SIGHUP), so in a suite started in the background (``pytest &``: the shell ignores SIGINT there) the
    launcher would rightly forward none: each test starts with the signals handled, as in a terminal's foreground."""
    from sanlab.training import launch

    ignored = [sig for sig in launch.FORWARDED if signal.getsignal(sig) == signal.SIG_IGN]
    for sig in ignored:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else (lambda *_: None))
    calls = []
    monkeypatch.setattr(launch.os, "kill", lambda pid, sig: calls.append((pid, signal.Signals(sig))))
    yield calls
    for sig in ignored:
        signal.signal(sig, signal.SIG_IGN)


def _raise(*signals):
    return lambda: [signal.raise_signal(s) for s in signals]


def test_a_signal_before_torchrun_has_a_pid_is_sent_once_it_has(monkeypatch, sent):
    from sanlab.training import launch

    monkeypatch.setattr(launch.subprocess, "Popen", _Torchrun(started=_raise(signal.SIGTERM), status=143))
    assert launch.launch(["torchrun"]) == 143
    assert sent == [(_Torchrun.pid, signal.SIGTERM)]


def test_a_signal_just_after_torchrun_started_is_sent_once(monkeypatch, sent):
    """The signal comes after torchrun has a pid and before the launcher looks for one that came earlier: the
    handler sends it, and the launcher must not send it again (torchrun took a second signal as a second Ctrl-C).
    Popen's stand-in hands the launcher's handler the child it is about to return (as the assignment would) and
    raises the signal: its handler runs before the launcher's check does."""
    from sanlab.training import launch

    torchrun = _Torchrun(status=143)

    def started():
        handler = signal.getsignal(signal.SIGTERM)
        assert handler.__qualname__ == "launch.<locals>.forward", handler
        handler.__closure__[handler.__code__.co_freevars.index("child")].cell_contents = torchrun
        signal.raise_signal(signal.SIGTERM)

    torchrun.started = started
    monkeypatch.setattr(launch.subprocess, "Popen", torchrun)
    assert launch.launch(["torchrun"]) == 143
    assert sent == [(_Torchrun.pid, signal.SIGTERM)]


def test_only_the_first_signal_is_sent_and_decides(monkeypatch, sent):
    from sanlab.training import launch

    monkeypatch.setattr(launch.subprocess, "Popen", _Torchrun(waiting=_raise(signal.SIGINT, signal.SIGTERM,
                                                                             signal.SIGINT), status=130))
    with pytest.raises(KeyboardInterrupt):
        launch.launch(["torchrun"])
    assert sent == [(_Torchrun.pid, signal.SIGINT)]
    monkeypatch.setattr(launch.subprocess, "Popen", _Torchrun(waiting=_raise(signal.SIGTERM, signal.SIGINT),
                                                              status=143))
    assert launch.launch(["torchrun"]) == 143
    assert sent[1:] == [(_Torchrun.pid, signal.SIGTERM)]


def test_a_run_that_ended_well_before_the_signal_reached_it_says_so(monkeypatch, sent):
    """torchrun ended with status 0 as the Ctrl-C came: the run finished, and the command says so."""
    from sanlab.training import launch

    monkeypatch.setattr(launch.subprocess, "Popen", _Torchrun(waiting=_raise(signal.SIGINT), status=0))
    assert launch.launch(["torchrun"]) == 0
    assert sent == [(_Torchrun.pid, signal.SIGINT)]


def test_an_ignored_signal_stays_ignored(monkeypatch, sent):
    """Under nohup SIGHUP is ignored: a closed terminal must not stop the run through the launcher."""
    from sanlab.training import launch

    monkeypatch.setattr(launch.subprocess, "Popen", _Torchrun(waiting=_raise(signal.SIGHUP), status=0))
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert launch.launch(["torchrun"]) == 0
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
    assert sent == []
