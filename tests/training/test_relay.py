"""How the processes of a data-parallel run tell each other of a failure (``training.distributed``'s
``main_first``, ``all_or_none``, ``RelayedError``, ``RelayedCrash``) and what a worker of ``sanlab train --nproc``
does with an error another process relayed to it: fast tests with stand-in collectives (no process group); the
launches that exercise them end to end are in test_distributed.py (slow)."""

import pytest

from sanlab.cli import main
from sanlab.config import dump_config


class _FakeCollectives:
    """Distributed's collectives as another rank would answer them (no process group): ``gather`` returns ``others``
    with this rank's value put in at its place, ``broadcast`` returns process 0's ``sent``."""

    def __init__(self, monkeypatch, *, others=None, sent=None):
        from sanlab.training.distributed import Distributed

        self.gathered = []

        def gather(dist, value):
            self.gathered.append(value)
            found = list(others)
            found[dist.rank] = value
            return found

        monkeypatch.setattr(Distributed, "gather", gather)
        monkeypatch.setattr(Distributed, "broadcast", lambda dist, value: sent if not dist.is_main else value)


def test_all_or_none_names_the_ranks_that_failed_on_every_rank(monkeypatch):
    """A sanlab error on some ranks: every rank raises the same TrainingError naming them (so the launcher's one
    message is the same whichever rank tells it first), ranks with the same error together; a crash (not a
    SanlabError) on another rank is a RelayedCrash, and the crashed rank raises its own error again."""
    from sanlab.errors import DataError, SanlabError, TrainingError
    from sanlab.training.distributed import Distributed, RelayedCrash, failure_report

    missing = failure_report(DataError("no such file", path="data/test.de"))
    _FakeCollectives(monkeypatch, others=[None, missing, missing, None])
    for rank in range(4):
        with pytest.raises(TrainingError) as raised:
            with Distributed(rank=rank, world_size=4).all_or_none("starting"):
                if rank in (1, 2):
                    raise DataError("no such file", path="data/test.de")
        assert str(raised.value) == "processes 1, 2 stopped while starting: data/test.de: no such file"
        assert not isinstance(raised.value, RelayedCrash)
    _FakeCollectives(monkeypatch, others=[None] * 4)
    with Distributed(rank=0, world_size=4).all_or_none("starting"):  # every rank's block went through: nothing
        pass

    crash = failure_report(KeyError("vocab"))
    _FakeCollectives(monkeypatch, others=[None, crash, failure_report(SanlabError("a user's mistake"))])
    with pytest.raises(RelayedCrash, match=r"^process 1 stopped while starting: KeyError: 'vocab'; process 2 stopped "
                                           r"while starting: a user's mistake$"):
        with Distributed(rank=0, world_size=3).all_or_none("starting"):
            pass
    with pytest.raises(KeyError, match="vocab"):  # (its traceback: torchrun's root cause)
        with Distributed(rank=1, world_size=3).all_or_none("starting"):
            raise KeyError("vocab")
    with pytest.raises(TrainingError) as raised:  # its own mistake beside another's crash: said, not swallowed
        with Distributed(rank=2, world_size=3).all_or_none("starting"):
            raise SanlabError("a user's mistake")
    assert not isinstance(raised.value, RelayedCrash) and "process 2 stopped while starting: a user's mistake" in str(
        raised.value)


def test_main_first_relays_a_sanlab_error_as_it_is_and_a_crash_as_a_relayed_crash(monkeypatch):
    """A sanlab error in its own words, as a RelayedError (process 0 tells the launcher; the others add nothing)."""
    from sanlab.errors import DataError
    from sanlab.training.distributed import Distributed, RelayedCrash, RelayedError, failure_report

    rank_1 = Distributed(rank=1, world_size=2)
    _FakeCollectives(monkeypatch, sent=failure_report(DataError("no such file", path="data/train.de")))
    with pytest.raises(RelayedError, match=r"^data/train.de: no such file$") as raised:
        with rank_1.main_first():
            pass
    assert not isinstance(raised.value, RelayedCrash)
    _FakeCollectives(monkeypatch, sent=failure_report(OSError(28, "No space left on device")))
    with pytest.raises(RelayedCrash, match=r"^process 0 stopped while starting: OSError: \[Errno 28\] No space left "
                                           r"on device$"):
        with rank_1.main_first():
            pass


def test_a_worker_stopped_by_another_process_waits_for_torchrun_and_leaves_the_telling_to_it(monkeypatch, tmp_path,
                                                                                             tiny_translation, capsys):
    """Under `sanlab train --nproc` a worker stopped by another process's failure neither prints nor writes it for the
    launcher: a RelayedCrash is torchrun's to report (its summary, with the crash's traceback), a RelayedError the
    failed process writes in its own words. It stands by first (``launch.stand_by``), for torchrun to end it once the
    failed process has exited: exiting at once raced that process, which torchrun could end before it had said
    anything. Only if torchrun never ends it does a relayed sanlab error reach the launcher, and only where the
    failed process wrote nothing. Started by hand (no launcher), a RelayedCrash is printed as a message."""
    import sanlab.runs
    from sanlab.errors import SanlabError
    from sanlab.training import launch
    from sanlab.training.distributed import RelayedCrash, RelayedError

    config = tmp_path / "tiny.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=1, valid_every=1)))
    where = tmp_path / "launch"
    where.mkdir()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(launch.LAUNCH_DIR_ENV, str(where))
    monkeypatch.setattr(launch, "STAND_BY_S", 0.0)  # (torchrun, here absent, would end the worker meanwhile)
    stood_by = []
    stand_by = launch.stand_by
    monkeypatch.setattr(launch, "stand_by", lambda message, *, crash: (stood_by.append(crash),
                                                                     stand_by(message, crash=crash)))
    error_file = where / launch.ERROR_FILE

    def stopped_by(error) -> int:
        monkeypatch.setattr(sanlab.runs, "train_run", lambda *a, **k: (_ for _ in ()).throw(error))
        return main(["train", str(config), "--run", str(tmp_path / "run")])

    relayed = "process 0 stopped while validating after update 2: the validation loss is nan"
    assert stopped_by(RelayedCrash("process 0 stopped while starting: KeyError: 'vocab'")) == 2
    assert stood_by == [True] and not error_file.exists() and capsys.readouterr().err == ""
    assert stopped_by(SanlabError("run locked")) == 2  # this process's own: written for the launcher at once
    assert stood_by == [True] and error_file.read_text() == "run locked"
    assert stopped_by(RelayedError(relayed)) == 2  # the failed process wrote first: nothing more
    assert stood_by == [True, False] and error_file.read_text() == "run locked"
    error_file.unlink()
    assert stopped_by(RelayedError(relayed)) == 2  # it never did: the relayed message, after standing by
    assert error_file.read_text() == relayed and capsys.readouterr().err == ""
    monkeypatch.delenv(launch.LAUNCH_DIR_ENV)
    assert stopped_by(RelayedCrash("crashed")) == 2 and len(stood_by) == 3
    assert capsys.readouterr().err == "sanlab train: error: crashed\n"


def _mirrored(monkeypatch, *, world_size=2, failing=None):
    """Distributed's collectives as if every other rank did what this one did, except rank ``failing`` (rank,
    exception), which fails in the first ``all_or_none`` block; returns the values this rank gathered."""
    from sanlab.training.distributed import Distributed, failure_report

    gathered = []

    def gather(dist, value):
        gathered.append(value)
        found = [value] * world_size
        if failing is not None and isinstance(value, (dict, type(None))) and len(gathered) == 1:
            found[failing[0]] = failure_report(failing[1])
        return found

    monkeypatch.setattr(Distributed, "gather", gather)
    monkeypatch.setattr(Distributed, "broadcast", lambda dist, value: value)
    monkeypatch.setattr(Distributed, "wrap", lambda dist, model, **kw: wrapped.append(model) or model)
    wrapped = []
    return gathered, wrapped


def _trainer(tmp_path, config, dist):
    from sanlab.runs import make_task
    from sanlab.training.logging import SilentLogger
    from sanlab.training.loop import Trainer

    run = tmp_path / "run"
    task = make_task(config, run, SilentLogger(run))
    return Trainer(task=task, config=config.train, run_dir=run, logger=SilentLogger(run), dist=dist)


def test_a_model_that_does_not_fit_one_ranks_device_stops_every_rank_before_ddps_set_up(tmp_path, tiny_translation,
                                                                                        monkeypatch):
    """Moving the model to the device is the first thing a rank can fail at alone (its GPU full: another job on it);
    the others must learn of it before DDP's set-up, a collective where they would wait for it. The failed rank says
    the model's size, what torch reported and what to try; the others name it."""
    import torch
    from torch import nn

    from sanlab.errors import TrainingError
    from sanlab.training.distributed import Distributed

    config = tiny_translation(max_steps=1)
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 1 has a total capacity of "
                                 "79.19 GiB of which 1.00 MiB is free.")
    with pytest.raises(TrainingError) as raised:  # rank 1's model does not fit; rank 0 is told
        gathered, wrapped = _mirrored(monkeypatch, failing=(1, TrainingError("moving the model ran out of memory")))
        _trainer(tmp_path, config, Distributed(rank=0, world_size=2))
    assert str(raised.value) == "process 1 stopped while starting: moving the model ran out of memory"
    assert wrapped == []  # never reached DDP's set-up

    def no_room(module, *args, **kwargs):
        raise oom

    monkeypatch.setattr(nn.Module, "to", no_room)
    gathered, wrapped = _mirrored(monkeypatch)
    with pytest.raises(TrainingError) as raised:  # rank 1's own: said with the model's size and what to try
        _trainer(tmp_path, config, Distributed(rank=1, world_size=2))
    message = str(raised.value)
    assert message.startswith("processes 0, 1 stopped while starting: moving the model (") and wrapped == []
    assert " parameters, " in message and "to the device ran out of memory on cpu: CUDA out of memory. " in message
    assert message.endswith("Free the device of other processes (nvidia-smi lists them), or train a smaller model.")
    assert gathered[0]["sanlab"] and gathered[0]["message"] in message  # what the others are told
    with pytest.raises(TrainingError, match=r"^moving the model \(.* parameters, .* MiB\) to the device ran out of "
                                            r"memory on cpu: CUDA out of memory"):  # one process: no ranks named
        _trainer(tmp_path, config, Distributed.single())


def test_a_rank_that_cannot_resume_stops_every_rank_naming_it(tmp_path, tiny_translation, monkeypatch):
    """A rank whose checkpoints are all damaged (a node's stale copy of the run directory) stops the others, which
    would otherwise wait for it in the check that every rank resumes from the same checkpoint."""
    from sanlab.errors import TrainingError
    from sanlab.training.checkpoint import DamagedCheckpoint
    from sanlab.training.distributed import Distributed
    from sanlab.runs.train import train_run

    config = tiny_translation(max_steps=2, valid_every=2)
    train_run(config, tmp_path / "run", quiet=True)
    damaged = DamagedCheckpoint("no intact checkpoint to resume from: step-00000002: model.safetensors differs")
    _mirrored(monkeypatch)
    trainer = _trainer(tmp_path, config, Distributed(rank=0, world_size=2))
    gathered, _ = _mirrored(monkeypatch, failing=(1, damaged))
    with pytest.raises(TrainingError, match=r"^process 1 stopped while resuming: no intact checkpoint to resume "
                                            r"from: step-00000002: model.safetensors differs$"):
        trainer.resume()
    assert len(gathered) == 1  # stopped at the outcomes of loading, before the comparison of checkpoints


def test_the_main_processs_records_failing_at_the_start_stop_every_rank(tmp_path, tiny_translation, monkeypatch):
    """The main process writes the session into meta.json while the others go on to the first update's all-reduce,
    where they would wait for it: its failure there (a full disk) is gathered with the others' outcomes, and it
    raises its own error (torchrun's root cause)."""
    import contextlib

    import sanlab.runs.train as train_module
    import sanlab.training.distributed as distributed
    from sanlab.training.distributed import Distributed

    gathered, _ = _mirrored(monkeypatch)
    monkeypatch.setattr(distributed, "from_environment",
                        lambda device: contextlib.nullcontext(Distributed(rank=0, world_size=2, device=device)))

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train_module, "record_session", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        train_module.train_run(tiny_translation(max_steps=1), tmp_path / "run", quiet=True)
    reports = [value for value in gathered if isinstance(value, dict)]
    assert reports == [{"sanlab": False, "message": "[Errno 28] No space left on device", "type": "OSError"}]


def test_a_new_run_whose_model_does_not_fit_is_taken_back(tmp_path, tiny_translation, monkeypatch):
    """A fresh run that stops before training (its model does not fit the device) leaves no half-made run directory:
    the same command later starts it anew, not as a resume of nothing."""
    import torch
    from torch import nn

    from sanlab.errors import TrainingError
    from sanlab.runs.train import train_run

    def no_room(module, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB.")

    monkeypatch.setattr(nn.Module, "to", no_room)
    with pytest.raises(TrainingError, match="to the device ran out of memory"):
        train_run(tiny_translation(max_steps=1), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()
