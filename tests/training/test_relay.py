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
