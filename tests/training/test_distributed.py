"""Data-parallel training (torchrun + DDP, gloo): two processes train what one process accumulating the
same batches trains, and an interrupted two-process run resumes to the uninterrupted parameters."""

import json
import os
import re

import pytest
import torch

from sanlab.cli import main
from sanlab.config import dump_config

from training_fixtures import no_model_dropout, train_processes

# a rank takes ~15 s alone; on a 2-core machine shared with a training run, CI's niced workers took past 180 s. The
# failures these launches test are ranks that wait for hours, so a generous bound still tells them apart.
RANK_TIMEOUT_S = 900

# each launch starts two Python processes (~10 s); torchrun's and the launcher's temporary files are checked
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("private_tmpdir")]


def test_two_processes_train_what_one_process_accumulating_their_batches_trains(tmp_path, tiny_translation):
    make = no_model_dropout(tiny_translation)  # dropout streams differ per process by design
    # Adam's eps = 1 makes the update about linear in small gradients: with the default 1e-9 Adam cancels
    # any constant factor, so gradients summed wrongly over processes (halved) would still pass
    # each process accumulates two micro-batches, the first under DDP's no_sync
    two = train_processes(tmp_path, make, "two", nproc=2, max_steps=5, valid_every=5, accum_steps=2, eps=1.0)
    one = train_processes(tmp_path, make, "one", nproc=1, max_steps=5, valid_every=5, accum_steps=4, eps=1.0)
    assert two.keys() == one.keys()
    moved = train_processes(tmp_path, make, "start", nproc=1, max_steps=0, valid_every=5, eps=1.0)
    for name in one:  # same update up to the order of the floating-point sums
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-6, msg=name)
    assert any(not torch.equal(one[n], moved[n]) for n in one)  # and training did change the weights


def test_an_epochs_last_batch_fewer_than_the_processes_is_trained_as_one_process_trains_it(tmp_path,
                                                                                          tiny_translation):
    """5 batches an epoch (max_tokens 300) in updates of 4: every epoch ends with a group of 1, which rank 1 joins
    at weight 0 (it used to be skipped: the two runs then parted at step 2)."""
    make = no_model_dropout(tiny_translation)
    two = train_processes(tmp_path, make, "two", nproc=2, max_steps=5, valid_every=5, accum_steps=2, eps=1.0,
                          max_tokens=300)
    one = train_processes(tmp_path, make, "one", nproc=1, max_steps=5, valid_every=5, accum_steps=4, eps=1.0,
                          max_tokens=300)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-6, msg=name)
    steps = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in steps) == 5 and "skipped" not in (tmp_path / "two" / "train.log").read_text()


def test_only_rank_0_reports(tmp_path, tiny_translation, capfd):
    """Rank 0 logs for all: each line of train.log reaches the terminal once (rank 1's logger says nothing), and
    rank 1 writes no log of its own."""
    config = tmp_path / "run.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=2, valid_every=2)))
    capfd.readouterr()
    assert main(["train", str(config), "--run", str(tmp_path / "run"), "--nproc", "2"]) == 0
    err = capfd.readouterr().err.splitlines()
    logged = (tmp_path / "run" / "train.log").read_text().splitlines()
    assert any("distributed data parallel: 2 processes (gloo)" in line for line in logged)
    assert [err.count(line) for line in logged] == [1] * len(logged)
    assert sorted(p.name for p in (tmp_path / "run").glob("*.log")) == ["train.log"]


def test_an_interrupted_two_process_run_resumes_to_the_uninterrupted_parameters(tmp_path, tiny_translation):
    straight = train_processes(tmp_path, tiny_translation, "straight", nproc=2, max_steps=6, valid_every=3)
    train_processes(tmp_path, tiny_translation, "resumed", nproc=2, max_steps=3, valid_every=3)
    resumed = train_processes(tmp_path, tiny_translation, "resumed", nproc=2, max_steps=6, valid_every=3)
    for name in straight:  # dropout on: every process's RNG stream was restored
        torch.testing.assert_close(resumed[name], straight[name], rtol=0, atol=0, msg=name)
    log = (tmp_path / "resumed" / "train.log").read_text()
    assert "2 processes" in log and "resumed from" in log and "WARNING" not in log
    train_processes(tmp_path, tiny_translation, "resumed", nproc=1, max_steps=7, valid_every=3)  # legal, but not silent
    log = (tmp_path / "resumed" / "train.log").read_text()
    assert "WARNING: the checkpoint was written by 2 process(es) and this run has 1" in log


def test_parameters_without_gradient_get_a_clear_error_naming_them(tmp_path, tiny_translation, capfd):
    (tmp_path / "tiny.yaml").write_text(dump_config(tiny_translation(max_steps=3, valid_every=3)))
    config = tmp_path / "muse.yaml"  # MUSE's decoder builds a LayerNorm it never calls (parameter parity)
    config.write_text("base: tiny.yaml\nmodel:\n  decoder:\n"
                      "    mixer: {type: muse, kernel_sizes: [3, 5], unused_cross_norm: true}\n")
    assert main(["train", str(config), "--run", str(tmp_path / "muse"), "--nproc", "2", "--quiet"]) != 0
    err = capfd.readouterr().err
    assert "--set train.find_unused_parameters=true" in err and "reference_only.weight" in err


# The launcher a rank-1 failure runs under: `python -m sanlab` (what `sanlab train --nproc` runs), with rank 1's
# loss made to raise from update FAIL_AT on; nothing in sanlab knows about it.
RANK_FAILS = """
import os, runpy, sys
from sanlab.training import loop

if os.environ.get("RANK") == "1":
    real = loop.Trainer._loss
    def failing(self, batch):
        if self.progress.step + 1 >= {fail_at}:
            raise RuntimeError(f"rank 1 fails on purpose at update {{self.progress.step + 1}}")
        return real(self, batch)
    loop.Trainer._loss = failing
sys.argv[0] = "sanlab"
runpy.run_module("sanlab", run_name="__main__")
"""


def _torchrun(tmp_path, argv: list[str]):
    """``torchrun --standalone --nproc_per_node=2 ARGV``, finished. Its log directory (the workers' error files) is
    ``tmp_path / "torchrun"``, as ``sanlab train --nproc`` gives it one: without PET_LOG_DIR torchrun makes a
    torchelastic_* of its own in the temporary directory and never removes it (``private_tmpdir`` checks)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *argv],
                          capture_output=True, text=True, timeout=RANK_TIMEOUT_S,
                          env={**os.environ, "PET_LOG_DIR": str(tmp_path / "torchrun")})


def test_a_crash_on_one_rank_ends_the_others_with_its_message_and_the_run_resumes(tmp_path, tiny_translation):
    """Rank 1 raises at update 4: rank 0, waiting in the gradient all-reduce, is ended too (no hang), the
    failure summary of torchrun names rank 1's error with its traceback (``record`` in sanlab/__main__.py), the
    checkpoint of update 2 is intact, and the run resumes from it to the end."""
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=6, valid_every=2)))
    launcher = tmp_path / "rank_fails.py"
    launcher.write_text(RANK_FAILS.format(fail_at=4))
    run = tmp_path / "run"
    done = _torchrun(tmp_path, [str(launcher), "train", str(config), "--run-dir", str(run), "--quiet"])
    assert done.returncode != 0
    # torchrun's summary lists every failed rank ("Failures:", then "Root Cause": the earliest error file). Which
    # rank is the root cause is a race: rank 0 may record gloo's "peer closed" a moment before rank 1's error
    # lands, so the test asks that rank 1's own entry, with its message, is in the summary.
    summary = done.stderr[done.stderr.index("Failures:"):]
    entries = re.split(r"^\[\d+\]:$", summary, flags=re.MULTILINE)
    assert any("rank      : 1 " in entry and "RuntimeError: rank 1 fails on purpose at update 4" in entry
               for entry in entries), summary
    assert list((tmp_path / "torchrun").rglob("error.json")), "rank 1's error file is in torchrun's log directory"
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-00000002"]
    assert main(["train", str(config), "--run", str(run), "--nproc", "2", "--quiet"]) == 0
    assert "resumed from" in (run / "train.log").read_text()
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*"))[-1] == "step-00000006"


def test_a_crash_on_one_rank_under_the_launcher_is_told_in_a_few_lines(tmp_path, tiny_translation, capfd):
    """Rank 1 raises at update 4 under `sanlab train --nproc 2`: the console got its traceback, rank 0's gloo
    "Connection reset by peer" traceback and torchrun's summary (~110 lines). Now: process 1's error in one line,
    with the line that raised it, that process 0 was stopped, the logs and the command that resumes; status 1.
    The tracebacks are in the run's launch.log."""
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=6, valid_every=2)))
    launcher = tmp_path / "rank_fails.py"
    launcher.write_text(RANK_FAILS.format(fail_at=4))
    run = tmp_path / "run"
    capfd.readouterr()
    status = _main_with_launcher(launcher, ["train", str(config), "--run", str(run), "--nproc", "2", "--quiet"])
    err = capfd.readouterr().err
    assert status == 1, err
    said = err.splitlines()  # (nothing of torchrun's own: the launcher gives it OMP_NUM_THREADS, so it warns not)
    assert len(said) == 4 and "Traceback" not in err and "Connection reset" not in err, err
    assert said[0].startswith("sanlab train: error: process 1 of 2 (pid ") and said[0].endswith(
        f") failed: RuntimeError: rank 1 fails on purpose at update 4 ({launcher}, line 9, in failing)"), err
    assert said[1:] == [
        "sanlab train: process 0 was stopped too (the checkpoints written so far are intact)",
        f"sanlab train: log: {run / 'train.log'}; tracebacks and torchrun's account: {run / 'launch.log'}",
        f"sanlab train: to resume from the last checkpoint: sanlab train {config} --run {run} --nproc 2 --quiet"], err
    log = (run / "launch.log").read_text()
    assert "Traceback" in log and "RuntimeError: rank 1 fails on purpose at update 4" in log, log


class _OldDDP:
    """DistributedDataParallel's constructor as torch 2.5 to 2.12 have it: no ``forward_sync_buffers``."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 find_unused_parameters=False):
        self.kwargs = {"broadcast_buffers": broadcast_buffers, "find_unused_parameters": find_unused_parameters}


class _NewDDP:
    """And as newer releases have it, where ``forward_sync_buffers`` replaces ``broadcast_buffers``."""

    def __init__(self, module, device_ids=None, broadcast_buffers=None, find_unused_parameters=False,
                 forward_sync_buffers=None):
        self.kwargs = {"forward_sync_buffers": forward_sync_buffers, "broadcast_buffers": broadcast_buffers}


@pytest.mark.parametrize("ddp, expected", [(_OldDDP, {"broadcast_buffers": False, "find_unused_parameters": True}),
                                           (_NewDDP, {"forward_sync_buffers": False, "broadcast_buffers": None})])
def test_wrap_turns_off_buffer_sync_by_the_name_this_torch_knows(monkeypatch, ddp, expected):
    # torch 2.13 renamed the switch; passing the new name to an older torch is a TypeError at the first update
    from sanlab.training.distributed import Distributed

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", ddp)
    wrapped = Distributed(rank=0, world_size=2).wrap(torch.nn.Linear(2, 2), find_unused_parameters=True)
    assert wrapped.kwargs == expected


def test_accumulation_micro_batches_skip_ddps_all_reduce_but_the_last(tmp_path, tiny_translation, monkeypatch):
    """The gradients come out the same either way (test above), so only the calls show that accumulating
    micro-batches skip DDP's all-reduce: the loop asks for it at each update's last batch only, and
    ``Distributed.no_sync`` is DDP's own ``no_sync`` exactly where processes share gradients."""
    import contextlib

    from sanlab.runs import train_run
    from sanlab.training.distributed import Distributed

    flags = []
    real = Distributed.no_sync
    monkeypatch.setattr(Distributed, "no_sync", lambda self, wrapped, sync: flags.append(sync) or real(self, wrapped,
                                                                                                      sync))
    train_run(tiny_translation(max_steps=2, valid_every=2, accum_steps=3), tmp_path / "run", quiet=True)
    assert flags == [False, False, True] * 2

    class Wrapped:
        def no_sync(self):
            return "DDP's no_sync"

    assert Distributed(rank=1, world_size=2).no_sync(Wrapped(), sync=False) == "DDP's no_sync"
    assert isinstance(Distributed(rank=1, world_size=2).no_sync(Wrapped(), sync=True), contextlib.nullcontext)
    assert isinstance(Distributed().no_sync(Wrapped(), sync=False), contextlib.nullcontext)  # one process: no DDP


# Rank 0's validation made to raise: what a full disk or a decoding bug does there. Launched below without
# torchrun (each process started by hand with RANK, WORLD_SIZE and MASTER_*, as srun or mpirun would), so no
# agent ends rank 1, which waits for rank 0 in a collective.
VALIDATION_FAILS = """
import os, runpy, sys
from sanlab.training import loop

if os.environ.get("RANK") == "0":
    def failing(self, rngs, *, on_schedule):
        raise OSError(28, "No space left on device (on purpose)")
    loop.Trainer._validate_and_save = failing
sys.argv[0] = "sanlab"
runpy.run_module("sanlab", run_name="__main__")
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_by_hand(command: list[str], world_size: int, attempts: int = 3) -> list[tuple[int, str]]:
    """Each rank started as its own process with RANK, WORLD_SIZE and MASTER_* (as srun or mpirun would), on a
    free port; returns (exit status, stderr) per rank. The port is found free and then released before rank 0's
    store binds it, so another test (torchrun's --standalone picks ports too) can take it meanwhile: rank 0 then
    fails with EADDRINUSE, and the others would wait on somebody else's store. That launch is ended and retried
    on a new port."""
    import subprocess

    first = ""
    for _ in range(attempts):
        port = _free_port()
        procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
                                       "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
                 for rank in range(world_size)]
        try:
            first = procs[0].communicate(timeout=RANK_TIMEOUT_S)[1]  # rank 0 first: a lost port ends it at once
            if procs[0].returncode != 0 and "address already in use" in first.lower():  # (EADDRINUSE, any wording)
                continue  # (the finally below ends the others)
            rest = [p.communicate(timeout=RANK_TIMEOUT_S)[1] for p in procs[1:]]  # (before their returncode: set then)
            return [(procs[0].returncode, first)] + [(p.returncode, err) for p, err in zip(procs[1:], rest)]
        finally:
            for p in procs:
                p.kill()
                p.wait()  # reaped, and its pipes closed
                p.stdout.close()
                p.stderr.close()
    raise AssertionError(f"no free port for rank 0's store in {attempts} attempts; its last stderr:\n{first[-2000:]}")


def test_a_failed_validation_on_rank_0_ends_the_other_ranks_under_any_launcher(tmp_path, tiny_translation):
    import sys

    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=4, valid_every=2)))
    launcher = tmp_path / "validation_fails.py"
    launcher.write_text(VALIDATION_FAILS)
    # (without the fix rank 1 waits for hours)
    ranks = _launch_by_hand([sys.executable, str(launcher), "train", str(config), "--run-dir", str(tmp_path / "run"),
                             "--quiet"], world_size=2)
    errors = [err for _, err in ranks]
    assert all(status != 0 for status, _ in ranks), errors
    assert "No space left on device (on purpose)" in errors[0], errors[0]
    assert ("process 0 stopped while validating after update 2: OSError: [Errno 28] No space left on device "
            "(on purpose)") in errors[1], errors[1]


def _hand_launched_rank(monkeypatch, rank: int, port: int) -> None:
    """This process as rank ``rank`` of 2 started by hand (no torchrun agent), rank 0 expected at ``port``."""
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    for name, value in {"RANK": rank, "WORLD_SIZE": 2, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}.items():
        monkeypatch.setenv(name, str(value))


# Before, the meeting of hand-launched ranks was bounded by the collectives' 4-hour timeout: a rank whose rank 0
# never came up waited that long in silence. Each case below would hang for hours without the fix.
def test_a_rank_started_by_hand_whose_rank_0_never_comes_up_stops_with_a_clear_error(monkeypatch):
    from datetime import timedelta

    from sanlab.training.distributed import from_environment

    port = _free_port()  # nobody listens there
    _hand_launched_rank(monkeypatch, 1, port)
    with pytest.raises(RuntimeError, match=rf"rank 1 of 2 could not meet rank 0 at 127\.0\.0\.1:{port} within 2 s: "
                                           r"are all ranks started with the same MASTER_ADDR and MASTER_PORT"):
        with from_environment(rendezvous_timeout=timedelta(seconds=2)):
            pass


def test_rank_0_started_by_hand_names_a_taken_port_and_ranks_that_never_come(monkeypatch):
    import socket
    from datetime import timedelta

    from sanlab.training.distributed import from_environment

    with socket.socket() as taken:  # another program holds rank 0's port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        _hand_launched_rank(monkeypatch, 0, taken.getsockname()[1])
        with pytest.raises(RuntimeError, match=r"rank 0 of 2 could not serve the rendezvous on 127\.0\.0\.1:\d+, or "
                                               r"not all 2 ranks reached it within 2 s: .*is that port free"):
            with from_environment(rendezvous_timeout=timedelta(seconds=2)):
                pass
    _hand_launched_rank(monkeypatch, 0, _free_port())  # the port is free, but rank 1 never starts
    with pytest.raises(RuntimeError, match=r"rank 0 of 2 could not serve .* within 2 s"):
        with from_environment(rendezvous_timeout=timedelta(seconds=2)):
            pass


# A rank unwinding after rank 0 failed froze in CI: freeing its DDP model freed the process group last, and gloo's
# destructor, run with the GIL held, joined a worker thread that needed the GIL to free the last broadcast's
# tensors. The script below forces that moment: a broadcast in flight when the model is freed. With a plain
# destroy_process_group it hangs within a few rounds; _tear_down keeps the group, so the reducer never frees it. In a
# subprocess, as a failure hangs the interpreter.
DDP_FREED_WITH_WORK_IN_FLIGHT = """
import torch, torch.distributed as dist
from sanlab.training import distributed
for _ in range(50):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    model(torch.ones(1, 2)).sum().backward()
    distributed._tear_down()
    group, tensor = model.process_group, torch.ones(1)
    work = group.broadcast([tensor])
    del tensor, work, group  # a gloo worker may now hold the tensor's last reference
    del model  # the reducer: were it the group's last holder, this would join that worker with the GIL held
    distributed._release_retired_groups()  # (as the next from_environment does; torch < 2.8 keeps them)
assert len(distributed._RETIRED_GROUPS) == (50 if distributed.KEEP_RETIRED_GROUPS else 0)
print("done")
"""


def test_freeing_a_ddp_model_with_a_collective_in_flight_does_not_hang_the_teardown():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", DDP_FREED_WITH_WORK_IN_FLIGHT], capture_output=True, text=True,
                          timeout=120)
    # (torch 2.8 prints gloo's "[Gloo] Rank 0 is connected to 0 peer ranks..." lines to stdout too)
    assert done.returncode == 0 and done.stdout.splitlines()[-1:] == ["done"], done.stderr[-2000:]


def test_bad_master_variables_are_named(monkeypatch):
    from sanlab.training.distributed import from_environment

    _hand_launched_rank(monkeypatch, 1, "29500x")
    with pytest.raises(RuntimeError, match=r"MASTER_ADDR and MASTER_PORT must name .* MASTER_PORT='29500x'"):
        with from_environment():
            pass


# The launcher of a loss that turns NaN at update 4 on every rank (each process's share of it).
LOSS_TURNS_NAN = """
import runpy, sys
from sanlab.training import loop

real = loop.Trainer._loss
def nan_from_update_4(self, batch):
    loss = real(self, batch)
    return loss * float("nan") if self.progress.step + 1 >= 4 else loss
loop.Trainer._loss = nan_from_update_4
sys.argv[0] = "sanlab"
runpy.run_module("sanlab", run_name="__main__")
"""


# A torchrun launcher that records, in a file per rank, every path the rank opens for writing, renames or copies
# onto (a Python audit hook), and may give rank 1 another --run-dir than rank 0's: what a node without the shared
# filesystem, or with a stale copy of an earlier run at the same path, sees.
SHARED_FILES_LAUNCHER = """
import os, runpy, sys

rank = os.environ["RANK"]
if rank == "1" and {other_run!r}:
    sys.argv[sys.argv.index("--run-dir") + 1] = {other_run!r}
record = open({record!r}.format(rank=rank), "w", buffering=1)
WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def hook(event, args):
    if event == "open":  # open(): (path, mode, flags); os.open(): (path, None, flags)
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & WRITES)
    elif event in ("os.rename", "shutil.copyfile"):  # (source, destination, ...): os.replace is os.rename's
        path, writes = args[1], True
    else:
        return
    if writes and isinstance(path, (str, bytes, os.PathLike)):
        record.write(os.path.abspath(os.fsdecode(path)) + "\\n")


sys.addaudithook(hook)
sys.argv[0] = "sanlab"
runpy.run_module("sanlab", run_name="__main__")
"""


def test_every_rank_stopped_by_a_nan_names_the_checkpoint_rank_0_wrote_as_the_last_good_one(tmp_path,
                                                                                              tiny_translation):
    """Only rank 0 writes checkpoints: the others named None (or the one they resumed from) as the last good one."""
    import sys

    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=6, valid_every=2)))
    launcher = tmp_path / "loss_turns_nan.py"
    launcher.write_text(LOSS_TURNS_NAN)
    run = tmp_path / "run"
    ranks = _launch_by_hand([sys.executable, str(launcher), "train", str(config), "--run-dir", str(run), "--quiet"],
                            world_size=2)
    errors = [err for _, err in ranks]
    assert all(status != 0 for status, _ in ranks), errors
    for err in errors:
        assert "loss is nan at update 4" in err and f"Last good checkpoint: {run / 'checkpoints' / 'step-00000002'}" \
            in err, err[-3000:]


def _launch_recording(tmp_path, config, run, *, other_run=None):
    """``sanlab train CONFIG --run-dir RUN`` under torchrun with 2 processes and SHARED_FILES_LAUNCHER; (the
    finished process, each rank's written paths)."""
    from pathlib import Path

    launcher, record = tmp_path / "recording.py", tmp_path / "written-by-rank-{rank}.txt"
    launcher.write_text(SHARED_FILES_LAUNCHER.format(other_run=str(other_run or ""), record=str(record)))
    done = _torchrun(tmp_path, [str(launcher), "train", str(config), "--run-dir", str(run), "--quiet"])
    written = [Path(str(record).format(rank=r)).read_text().splitlines() for r in (0, 1)]
    return done, [[Path(p) for p in paths] for paths in written]


@pytest.mark.parametrize("task", ["translation", "tagging"])
def test_only_rank_0_writes_the_vocabulary_and_rank_1_writes_nothing_in_the_run(tmp_path, tiny_translation, task):
    """Rank 1 reads rank 0's subword model / tagger-vocab.json from the run directory: it neither trains, copies
    nor builds one (there, in the data cache or anywhere), and writes nothing into the run directory at all."""
    from training_fixtures import make_tagging_config

    made = tiny_translation(max_steps=2, valid_every=2) if task == "translation" else \
        make_tagging_config(tmp_path, max_steps=2, valid_every=2)
    config, run = tmp_path / "run.yaml", (tmp_path / "run").resolve()
    config.write_text(dump_config(made))
    done, (rank0, rank1) = _launch_recording(tmp_path, config, run)
    assert done.returncode == 0, done.stderr[-3000:]
    vocabulary = "subword.model" if task == "translation" else "tagger-vocab.json"
    assert run / vocabulary in rank0  # (the hook sees the writes: rank 0's is there)
    assert [p for p in rank1 if p.is_relative_to(run)] == []
    assert [p for p in rank1 if p.name.startswith(("subword", ".subword", "tagger-vocab", ".tagger-vocab"))] == []
    assert (run / "checkpoints" / "step-00000002").is_dir()


@pytest.mark.parametrize("stale", [False, True])
def test_a_rank_that_sees_a_missing_or_stale_subword_model_stops_every_rank_naming_it(tmp_path, tiny_translation,
                                                                                      stale):
    """Rank 1 started on another directory (a node without the shared filesystem): with no subword model there, or
    a stale one of an earlier run (another vocabulary), both ranks stop before training, naming rank 1's file."""
    from sanlab.data.subword import SubwordModel

    config, run, elsewhere = tmp_path / "run.yaml", tmp_path / "run", tmp_path / "elsewhere"
    config.write_text(dump_config(tiny_translation(max_steps=2, valid_every=2)))
    elsewhere.mkdir()
    if stale:
        texts = (tmp_path / "train.src").read_text().splitlines()
        SubwordModel.train(texts, model_path=elsewhere / "subword", vocab_size=30)
    done, (_, rank1) = _launch_recording(tmp_path, config, run, other_run=elsewhere)
    assert done.returncode != 0
    if stale:
        assert re.search(rf"rank 1's {re.escape(str(elsewhere / 'subword.model'))} \(sha256 \w+\) differs from rank "
                         rf"0's {re.escape(str(run / 'subword.model'))}", done.stderr), done.stderr[-3000:]
    else:
        assert f"rank 1 has no {elsewhere / 'subword.model'}" in done.stderr, done.stderr[-3000:]
    assert "every process must see the same run directory" in done.stderr
    assert not (run / "checkpoints").exists() and not (elsewhere / "checkpoints").exists()
    assert [p for p in rank1 if p.name.startswith(("subword", ".subword"))] == []


def test_a_process_with_world_size_but_no_rank_is_told_what_torchrun_sets(monkeypatch, tmp_path, tiny_translation,
                                                                            capsys):
    """Processes started half-way by hand (WORLD_SIZE exported, RANK forgotten) stopped with KeyError: 'RANK'."""
    from sanlab.errors import SanlabError
    from sanlab.training.distributed import from_environment

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SanlabError, match=r"WORLD_SIZE=2 in the environment but no RANK: a process of a data-parallel "
                                          r"run needs RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"):
        with from_environment():
            pass
    for name, value, said in (("RANK", "2", r"RANK=2 in the environment but WORLD_SIZE=2: ranks run from 0 to 1"),
                              ("RANK", "one", r"RANK=one in the environment: expected a whole number"),
                              ("WORLD_SIZE", "2x", r"WORLD_SIZE=2x in the environment: expected a whole number"),
                              ("WORLD_SIZE", "²", r"WORLD_SIZE=² in the environment: expected a whole number")):
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv(name, value)
        with pytest.raises(SanlabError, match=said):
            with from_environment():
                pass
        monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK")  # and the command says it as a message, before touching the run directory
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=1, valid_every=1)))
    assert main(["train", str(config), "--run", str(tmp_path / "run")]) == 2
    assert "sanlab train: error: WORLD_SIZE=2 in the environment but no RANK" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_failed_start_on_rank_0_stops_every_rank_with_its_message(tmp_path, tiny_translation, capfd):
    """Rank 0 alone locks the run directory: with the run locked by another process (this test) its start fails.
    Started by hand, rank 1 waited for it in a barrier for hours; under `sanlab train --nproc` it died with gloo's
    "Connection closed by peer" traceback beside rank 0's message and torchrun's failure summary. Now rank 0 sends
    its outcome where the others wait, and the launcher prints the message once, with status 2."""
    import sys

    from sanlab.training.rundir import run_lock

    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=2, valid_every=2)))
    run = tmp_path / "run"
    locked = f"{run} is being trained or evaluated by another process (pid {os.getpid()})"
    with run_lock(run):
        ranks = _launch_by_hand([sys.executable, "-m", "sanlab", "train", str(config), "--run-dir", str(run),
                                 "--quiet"], world_size=2)
        for rank, (status, err) in enumerate(ranks):
            assert status == 2 and f"sanlab train: error: {locked}" in err and "Traceback" not in err, (rank, err)
        capfd.readouterr()
        assert main(["train", str(config), "--run", str(run), "--nproc", "2", "--quiet"]) == 2
    err = capfd.readouterr().err
    assert err.count(locked) == 1 and f"sanlab train: error: {locked}" in err, err
    assert "Failures:" not in err and "Traceback" not in err and "exitcode" not in err, err
    assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing of the run was written


# make_task made to fail on one rank: on rank 0 (which builds first) or on the others (which read its files)
START_FAILS = """
import os, runpy, sys
from sanlab.errors import DataError
from sanlab.runs import train

real = train.make_task
def failing(config, run_dir, log, *, main=True):
    if os.environ.get("RANK") == "{rank}":
        raise {error}
    return real(config, run_dir, log, main=main)
train.make_task = failing
sys.argv[0] = "sanlab"
runpy.run_module("sanlab", run_name="__main__")
"""


def test_a_failed_start_on_rank_1_stops_every_rank_naming_it(tmp_path, tiny_translation, capfd):
    """Rank 1's make_task fails after rank 0 built its task (its node lacks the test set): rank 0 went on into DDP's
    set-up, dying with gloo's "connection closed" (under NCCL, started by hand, waiting 4 hours). Now every rank
    stops with the same message naming rank 1, by hand and under `sanlab train --nproc` (once, status 2)."""
    import sys

    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=2, valid_every=2)))
    launcher = tmp_path / "start_fails.py"
    launcher.write_text(START_FAILS.format(rank=1, error='DataError("no such file", path="data/test.de")'))
    said = "process 1 stopped while starting: data/test.de: no such file"
    ranks = _launch_by_hand([sys.executable, str(launcher), "train", str(config), "--run-dir", str(tmp_path / "run"),
                             "--quiet"], world_size=2)
    for rank, (status, err) in enumerate(ranks):
        assert status == 2 and f"sanlab train: error: {said}" in err and "Traceback" not in err, (rank, err)
    assert not (tmp_path / "run").exists()  # a new run's failed start is taken back
    capfd.readouterr()
    assert _main_with_launcher(launcher, ["train", str(config), "--run", str(tmp_path / "run"), "--nproc", "2",
                                          "--quiet"]) == 2
    err = capfd.readouterr().err
    assert err.count(said) == 1 and f"sanlab train: error: {said}" in err, err
    assert "Failures:" not in err and "Traceback" not in err and "launch.log" not in err, err


def _main_with_launcher(launcher, argv: list[str]) -> int:
    """``main(argv)`` (``sanlab train --nproc``) with each worker run by ``launcher`` instead of ``-m sanlab``."""
    from sanlab.training import launch

    made = launch.torchrun_command
    with pytest.MonkeyPatch.context() as patch:
        def command(args):
            parts = made(args)
            at = parts.index("-m", len(launch.TORCHRUN))  # torchrun's "-m sanlab", after its own "-m ..."
            return parts[:at] + [str(launcher)] + parts[at + 2:]
        patch.setattr(launch, "torchrun_command", command)
        return main(argv)


def test_a_crash_of_rank_0_while_starting_is_told_as_a_crash(tmp_path, tiny_translation, capfd):
    """Rank 0's make_task raises a KeyError (a bug): under `sanlab train --nproc` rank 1 relayed it as a sanlab
    error, which the launcher printed as "process 0 stopped while starting: KeyError" with status 2, leaving out
    the traceback. Then torchrun reported it (its summary, ~60 lines with rank 0's traceback as the root cause); now
    the launcher says in a few lines that process 0 failed, with its error and the line that raised it (status 1),
    and torchrun's summary with the traceback is in the run's launch.log. Started by hand, rank 1 says what stopped
    it."""
    import sys

    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=2, valid_every=2)))
    launcher = tmp_path / "start_fails.py"
    launcher.write_text(START_FAILS.format(rank=0, error='KeyError("a bug on purpose")'))
    capfd.readouterr()
    status = _main_with_launcher(launcher, ["train", str(config), "--run", str(tmp_path / "run"), "--nproc", "2",
                                            "--quiet"])
    err = capfd.readouterr().err
    assert status == 1, err
    assert "stopped while starting" not in err and "Traceback" not in err and "Root Cause" not in err, err
    assert ("sanlab train: error: process 0 of 2 (pid " in err and f") failed: KeyError: 'a bug on purpose' "
            f"({launcher}, line 9, in failing)" in err), err
    assert "sanlab train: process 1 was stopped too" in err, err
    log = (tmp_path / "run" / "launch.log").read_text()
    root = log[log.index("Root Cause"):]
    assert "rank      : 0 " in root and "KeyError: 'a bug on purpose'" in root and "Traceback" in root, root
    ranks = _launch_by_hand([sys.executable, str(launcher), "train", str(config), "--run-dir", str(tmp_path / "hand"),
                             "--quiet"], world_size=2)
    assert "KeyError: 'a bug on purpose'" in ranks[0][1] and "Traceback" in ranks[0][1], ranks[0][1]
    assert ranks[1][0] == 2 and ("sanlab train: error: process 0 stopped while starting: KeyError: 'a bug on "
                                 "purpose'") in ranks[1][1], ranks[1][1]


def test_more_processes_than_an_epochs_batches_is_refused_and_a_new_run_is_taken_back(tmp_path, tiny_translation,
                                                                                     capfd):
    """3 processes on an epoch of 2 batches (max_tokens 900): the documented error, once, status 2. The error says to
    use fewer processes or smaller batches, so the new run it stopped is taken back, as other failed starts are: it
    was left with its config.yaml, and the command with smaller batches was then refused as a different config."""
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=2, valid_every=2, max_tokens=900, threads=1)))
    run = tmp_path / "run"
    capfd.readouterr()
    assert main(["train", str(config), "--run", str(run), "--nproc", "3", "--quiet"]) == 2
    err = capfd.readouterr().err
    said = "epoch 0 has 2 batch(es), fewer than the 3 processes: use fewer processes or smaller batches"
    assert err.count(said) == 1 and f"sanlab train: error: {said}" in err and "Traceback" not in err, err
    assert "launch.log" not in err, err  # (no process crashed beside it: nothing kept)
    assert not run.exists()


def test_a_launch_leaves_nothing_in_the_temporary_directory(tmp_path, tiny_translation, private_tmpdir):
    """torchrun's log directory (its workers' error files) went to a /tmp/torchelastic_* of its own, which it never
    removes: every `sanlab train --nproc` left one. It is now inside the launch directory, removed with it."""
    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=1, valid_every=1, threads=1)))
    assert main(["train", str(config), "--run", str(tmp_path / "run"), "--nproc", "2", "--quiet"]) == 0
    assert sorted(p.name for p in private_tmpdir.iterdir() if not p.name.startswith("torchinductor_")) == []


def test_a_cuda_process_selects_its_gpu_before_the_nccl_group_and_ddp_uses_it(monkeypatch):
    """NCCL's object collectives (broadcast_object_list, all_gather_object: main_first, all_or_none, gather) put
    their bytes on torch.cuda.current_device(): without torch.cuda.set_device(cuda:LOCAL_RANK) before the group,
    every process's would land on cuda:0 (and NCCL refuses two ranks on one GPU). What can be seen without a GPU:
    the calls ``from_environment`` makes for a CUDA device, and DDP's device_ids from it."""
    from sanlab.training import distributed

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", torch.device(device))))
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group",
                        lambda **kwargs: calls.append(("init_process_group", kwargs["backend"])))
    monkeypatch.setattr(distributed, "_tear_down", lambda: calls.append(("tear_down",)))
    monkeypatch.setattr(distributed, "_release_retired_groups", lambda: None)  # (this process's own groups kept)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    gpu = torch.device("cuda", 3)
    with distributed.from_environment(gpu) as dist:
        assert (dist.rank, dist.world_size, dist.device) == (3, 4, gpu)
    assert calls == [("set_device", gpu), ("init_process_group", "nccl"), ("tear_down",)]

    made = {}
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", lambda model, **kwargs: made.update(kwargs))
    dist.wrap(torch.nn.Linear(2, 2))
    assert made["device_ids"] == [3]
