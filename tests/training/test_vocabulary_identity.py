"""Checkpoints record the vocabulary their weights were trained with (a digest of the subword model(s) or the
tagger's word list): loading them into a run of another vocabulary, or averaging checkpoints of two, is refused
instead of scoring nonsense; runs of one vocabulary (a grid's seeds) and checkpoints from before the record
are taken."""

import json
import shutil

import pytest

from sanlab.config import validate
from sanlab.errors import ConfigError
from sanlab.runs import average_run, evaluate_run, train_run
from sanlab.training.average import write_average
from sanlab.training.checkpoint import CheckpointManager
from training_fixtures import make_reverse_config, make_tagging_config


def _with(config, **data):
    raw = config.model_dump(mode="json")
    raw["data"].update(data)
    return validate(raw, source="test")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny translation runs of other subword vocabularies of one size and one of the first's vocabulary
    (another seed). Trained once for the module: the tests load, copy, average and evaluate their checkpoints,
    each into a name of its own, and never train them on."""
    import torch

    torch.set_num_threads(1)  # (built before the function-scoped autouse fixture that sets it)
    root = tmp_path_factory.mktemp("vocabularies")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SANLAB_CACHE_DIR", str(root / "cache"))
        # 36 pieces either way (the same shapes: only the vocabulary check tells the weights apart), other pieces
        config = _with(make_reverse_config(root, max_steps=6), subword={"vocab_size": 36, "model_type": "unigram"})
        other = _with(config, subword={"vocab_size": 36, "model_type": "bpe"})
        seed = validate({**config.model_dump(mode="json"),
                         "train": {**config.train.model_dump(mode="json"), "seed": 9}}, source="test")
        made = {}
        for name, c in (("a", config), ("b", other), ("a2", seed)):
            train_run(c, root / name, quiet=True)
            made[name] = root / name
        yield made


def _checkpoint(run):
    return CheckpointManager(run, keep_best=10, keep_last=10, higher_is_better=True).last(1)[0]


def test_weights_of_another_vocabulary_are_refused(runs, tmp_path):
    a, b = runs["a"], runs["b"]
    assert json.loads((_checkpoint(a) / "meta.json").read_text())["vocabulary"]
    with pytest.raises(ConfigError, match=f"{_checkpoint(a)}: trained with another vocabulary .* than the run {b}"):
        evaluate_run(b, checkpoint=str(_checkpoint(a)))
    assert not list(b.glob("eval-step-*.json"))
    copy = tmp_path / "from-a"   # (outside the shared runs, a name of its own: a step-N name would borrow a2's records)
    shutil.copytree(_checkpoint(a), copy)
    evaluate_run(runs["a2"], checkpoint=str(copy))  # one vocabulary (a grid's seeds): taken


def test_an_average_records_the_vocabulary_and_refuses_two(runs, tmp_path):
    a, b = runs["a"], runs["b"]
    with pytest.raises(ConfigError, match="trained with different vocabularies"):
        write_average([_checkpoint(a), _checkpoint(b)], tmp_path / "mixed")
    assert not (tmp_path / "mixed").exists()
    averaged = average_run(a, last=2)
    assert json.loads((averaged / "meta.json").read_text())["vocabulary"] == \
        json.loads((_checkpoint(a) / "meta.json").read_text())["vocabulary"]
    with pytest.raises(ConfigError, match="trained with another vocabulary"):
        evaluate_run(b, checkpoint=str(averaged))


def test_a_checkpoint_from_before_the_record_is_taken(runs, tmp_path):
    copy = tmp_path / "old-checkpoint"
    shutil.copytree(_checkpoint(runs["a"]), copy)
    meta = json.loads((copy / "meta.json").read_text())
    del meta["vocabulary"]
    (copy / "meta.json").write_text(json.dumps(meta))
    evaluate_run(runs["b"], checkpoint=str(copy))   # (nothing says which vocabulary it had)


def test_a_tagger_records_its_word_list(tmp_path):
    first = make_tagging_config(tmp_path, max_steps=2)
    train_run(first, tmp_path / "t1", quiet=True)
    other = validate({**first.model_dump(mode="json"),
                      "data": {**first.data.model_dump(mode="json"), "vocab_fraction": 0.25}}, source="test")
    train_run(other, tmp_path / "t2", quiet=True)
    with pytest.raises(ConfigError, match="trained with another vocabulary"):
        evaluate_run(tmp_path / "t2", checkpoint=str(_checkpoint(tmp_path / "t1")))


def test_the_vocabulary_does_not_depend_on_this_machines_protobuf(runs, monkeypatch):
    """A GPU image whose protobuf cannot import sentencepiece's generated module (older than the one that made
    it) must load a run trained here: the digest is of the pieces and scores, read through sentencepiece."""
    from sanlab.data import subword
    from sanlab.runs import load_trained

    monkeypatch.setattr(subword, "_model_proto_class", lambda: None)
    load_trained(runs["a"], checkpoint="last")


def test_a_resume_over_another_vocabulary_is_refused(tmp_path):
    """tagger-vocab.json changed under a run (rebuilt from changed data, as its own error advises after damage):
    the resume refuses the checkpoint's rows instead of training them as other words."""
    config = make_tagging_config(tmp_path, max_steps=2)
    run = tmp_path / "t"
    train_run(config, run, quiet=True)
    vocab = json.loads((run / "tagger-vocab.json").read_text())
    vocab["words"][2], vocab["words"][3] = vocab["words"][3], vocab["words"][2]
    (run / "tagger-vocab.json").write_text(json.dumps(vocab))
    more = validate({**config.model_dump(mode="json"), "train": {**config.train.model_dump(mode="json"),
                                                                 "max_steps": 3}}, source="test")
    with pytest.raises(ConfigError, match="trained with another vocabulary"):
        train_run(more, run, quiet=True)


def test_a_run_whose_own_word_list_changed_says_so_not_to_load_its_checkpoint_elsewhere(tmp_path):
    """The run's own checkpoint against its replaced (or damaged) tagger-vocab.json: the error says the run's file
    changed, not to load the checkpoint "with the run it was trained in", which it is."""
    from sanlab.runs import load_trained

    run = tmp_path / "t"
    train_run(make_tagging_config(tmp_path, max_steps=2), run, quiet=True)
    vocab = json.loads((run / "tagger-vocab.json").read_text())
    vocab["words"][2], vocab["words"][3] = vocab["words"][3], vocab["words"][2]
    (run / "tagger-vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(ConfigError) as err:
        load_trained(run, checkpoint="last")
    assert f"{_checkpoint(run)}: trained with another vocabulary" in str(err.value)
    assert f"than {run}'s subword model or word list gives now" in str(err.value)
    assert "replaced or damaged since" in str(err.value) and "with the run it was trained in" not in str(err.value)
