"""A distributed run's other processes read the vocabulary / subword model(s) the main process wrote into the run
directory (``make_task(main=False)``) and write none; each process's copy is compared with the main one's by sha256
before it is read (``training.shared_files``). The two-process launches are in test_distributed.py."""

from types import SimpleNamespace

import pytest

from sanlab.errors import DataError, TrainingError
from sanlab.runs.build import make_task
from sanlab.tasks.base import task_for
from sanlab.training.logging import SilentLogger
from sanlab.training.shared_files import check_same_files, digests

from training_fixtures import make_reverse_config, make_tagging_config


def _state(run):
    """Every file of a run directory with its size and modification time (what a write would change)."""
    return {p.relative_to(run): (p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}


def _refuse(*_, **__):
    raise AssertionError("a process other than the main one built or wrote a vocabulary")


def test_another_process_reads_the_main_processs_subword_model_and_writes_nothing(tmp_path, monkeypatch):
    from sanlab.data.subword import SubwordModel
    from sanlab.tasks import translation_data

    config, run = make_reverse_config(tmp_path, max_steps=1), tmp_path / "run"
    main = make_task(config, run, SilentLogger(run))
    assert [p.name for p in task_for(config).shared_files(config, run)] == ["subword.model"]
    before = _state(run)
    for name, where in (("_train_subwords", translation_data), ("_copy_atomic", translation_data),
                        ("train", SubwordModel)):
        monkeypatch.setattr(where, name, _refuse)
    other = make_task(config, run, SilentLogger(run), main=False)
    assert other.vocabulary == main.vocabulary and other.spm.src.path == run / "subword.model"
    assert len(other.train) == len(main.train)  # the encoded corpus the main process put into the cache
    assert _state(run) == before


def test_another_process_reads_the_main_processs_tagging_vocabulary_and_writes_nothing(tmp_path, monkeypatch):
    from sanlab.tasks import tagging

    config, run = make_tagging_config(tmp_path, max_steps=1), tmp_path / "run"
    main = make_task(config, run, SilentLogger(run))
    assert [p.name for p in task_for(config).shared_files(config, run)] == ["tagger-vocab.json"]
    before = _state(run)
    monkeypatch.setattr(tagging, "build_vocab", _refuse)
    monkeypatch.setattr(tagging.TaggingVocab, "save", _refuse)
    other = make_task(config, run, SilentLogger(run), main=False)
    assert other.vocabulary == main.vocabulary and other.vocab.words == main.vocab.words
    assert _state(run) == before


@pytest.mark.parametrize("make, name", [(make_reverse_config, "subword.model"),
                                        (make_tagging_config, "tagger-vocab.json")])
def test_another_process_without_the_main_processs_file_names_it(tmp_path, make, name):
    config, run = make(tmp_path, max_steps=1), tmp_path / "elsewhere"
    run.mkdir()
    with pytest.raises(DataError, match=rf"{run / name}: no .* here, where the main process \(rank 0\) writes it.*"
                                        "every process must see the same run directory"):
        make_task(config, run, SilentLogger(run), main=False)
    assert list(run.iterdir()) == []


def test_a_task_whose_trainer_takes_no_main_is_built_as_before(tmp_path, monkeypatch):
    """A task of another package written before ``main`` existed has no shared files: every process builds it."""
    from sanlab.runs import build

    calls = []

    class Old:
        def trainer(self, config, run_dir, log):
            calls.append(run_dir)
            return "trainer"

    monkeypatch.setattr(build, "task_for", lambda config: Old())
    assert make_task(None, tmp_path, None, main=False) == "trainer" and calls == [tmp_path]


class _Ranks:
    """What ``Distributed.gather`` gives every process: each rank's value, here made up per rank."""

    def __init__(self, values):
        self.values, self.enabled = values, len(values) > 1

    def gather(self, value):
        return self.values


def test_files_differing_from_the_main_processs_stop_every_process_naming_them(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, text in ((a, "rank 0's"), (b, "stale")):
        d.mkdir()
        (d / "subword.model").write_text(text)
    mine = digests([a / "subword.model"])
    check_same_files(_Ranks([mine, mine]), [a / "subword.model"])  # the same bytes: nothing to say
    stale = digests([b / "subword.model"])
    with pytest.raises(TrainingError) as err:
        check_same_files(_Ranks([mine, stale, mine]), [a / "subword.model"])
    message = str(err.value)
    assert (f"rank 1's {b / 'subword.model'} (sha256 {stale[0][1][:12]}) differs from rank 0's "
            f"{a / 'subword.model'} (sha256 {mine[0][1][:12]})") in message
    assert "rank 2" not in message and "every process must see the same run directory" in message
    with pytest.raises(TrainingError, match=f"rank 1 has no {b / 'tagger-vocab.json'}"):
        check_same_files(_Ranks([mine, digests([b / "tagger-vocab.json"])]), [a / "subword.model"])


def test_one_process_compares_nothing():
    one = SimpleNamespace(enabled=False, gather=lambda value: [value])
    check_same_files(one, [])
    check_same_files(one, ["/nowhere/subword.model"])  # (one process: its own files are the main ones)
