"""A tagging run's vocabulary and word groups follow the training data the run trained on."""

import json
import os
import time

import pytest

from sanlab.errors import DataError
from sanlab.runs import evaluate_run, train_run
from training_fixtures import killed_at_its_first_update, make_tagging_config


def _change(path, extra):
    """Append to a training file so that its fingerprint changes (size and time)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(extra)
    later = time.time() + 5
    os.utime(path, (later, later))


def test_evaluate_refuses_a_training_file_changed_since_the_run_trained(tmp_path):
    """The dev and test words are grouped (OOV, ambiguous, one training tag) against the training file: read as
    it is now after it changed, the groups would be another corpus's under this run's name."""
    config = make_tagging_config(tmp_path, max_steps=2)
    run = tmp_path / "run"
    train_run(config, run, quiet=True)
    assert evaluate_run(run, splits=["dev"])["dev"]["n_all"] > 0
    _change(config.data.dev, "1\tZzyzx\t_\tINTJ\t_\t_\t_\t_\t_\t_\n\n")  # a dev file changed: scored as it is
    assert evaluate_run(run, splits=["dev"])["dev"]["n_all"] > 0
    train = config.data.train
    _change(train, "1\tZzyzx\t_\tINTJ\t_\t_\t_\t_\t_\t_\n\n")
    with pytest.raises(DataError, match=f"{train}: changed since the run in {run} trained on it"):
        evaluate_run(run, splits=["dev"])


def test_a_run_killed_before_its_first_checkpoint_builds_its_vocabulary_again(tmp_path, monkeypatch):
    """Restarted from step 0 on changed data (--allow-changed-data), the run's vocabulary is the new data's: a
    tag added since is a training target, not <unk-tag>. A resume keeps its checkpoints' vocabulary."""
    config = make_tagging_config(tmp_path, max_steps=2)
    run = tmp_path / "run"
    killed_at_its_first_update(config, run, monkeypatch)
    vocab = run / "tagger-vocab.json"
    assert vocab.is_file()
    _change(config.data.train, "1\tZzyzx\t_\tNEWTAG\t_\t_\t_\t_\t_\t_\n\n")
    train_run(config, run, quiet=True, allow_changed_data=True)
    assert "NEWTAG" in json.loads(vocab.read_text())["tags"]

    _change(config.data.train, "1\tQwxyz\t_\tOTHERTAG\t_\t_\t_\t_\t_\t_\n\n")  # now a resume: the vocabulary stays
    train_run(make_tagging_config(tmp_path, max_steps=3), run, quiet=True, allow_changed_data=True)
    assert "OTHERTAG" not in json.loads(vocab.read_text())["tags"]


def test_the_tagger_never_predicts_the_unknown_tag(tmp_path):
    """<unk-tag> is the target of a tag the training file lacks, not a tag: even a model that favours it (here
    by its bias) predicts a real one, which CoNLL-U output and accuracy both need."""
    import torch

    from sanlab.data.conllu_io import read_conllu
    from sanlab.models.builders import build_tagger
    from sanlab.tasks.tagging import UNKNOWN_TAG, build_vocab, predict_tags

    config = make_tagging_config(tmp_path)
    train, dev = read_conllu(config.data.train), read_conllu(config.data.dev)
    vocab = build_vocab(config, train=train, dev=dev, test=[])
    model = build_tagger(config.model, vocab_size=len(vocab.words), num_chars=len(vocab.chars),
                         num_tags=len(vocab.tags))
    assert vocab.tags[-1] == UNKNOWN_TAG
    with torch.no_grad():
        model.classifier.bias[-1] = 1e4
    predicted = {t for sent in predict_tags(model, vocab, dev, max_chars=config.model.max_word_chars) for t in sent}
    assert predicted and UNKNOWN_TAG not in predicted


def test_predicted_tags_come_back_in_input_order_from_batches_sorted_by_length(tmp_path, monkeypatch):
    """Where padding is masked, ``predict_tags`` batches sentences of similar length together; the tags still come
    back in the order given, the same as one sentence per batch (no padding at all)."""
    import torch

    from sanlab.data.conllu_io import read_conllu
    from sanlab.models.builders import build_tagger
    from sanlab.tasks import tagging

    config = make_tagging_config(tmp_path)
    train, dev = read_conllu(config.data.train), read_conllu(config.data.dev)
    vocab = tagging.build_vocab(config, train=train, dev=dev, test=[])
    torch.manual_seed(0)
    model = build_tagger(config.model, vocab_size=len(vocab.words), num_chars=len(vocab.chars),
                         num_tags=len(vocab.tags))
    batches = []
    real_encode = tagging.encode_batch
    monkeypatch.setattr(tagging, "encode_batch", lambda vocab, group, **kw: batches.append(group) or
                        real_encode(vocab, group, **kw))
    sents = dev[::-1]  # (dev's own order is not by length either)
    alone = [tagging.predict_tags(model, vocab, [s], max_chars=config.model.max_word_chars)[0] for s in sents]
    batches.clear()
    together = tagging.predict_tags(model, vocab, sents, max_chars=config.model.max_word_chars, batch_size=6)
    assert together == alone and [len(t) for t in together] == [len(s.words) for s in sents]
    lengths = [len(s.words) for group in batches for s in group]
    assert lengths == sorted(lengths) != [len(s.words) for s in sents] and len(batches) == 4


def test_an_update_encodes_only_the_batches_this_process_trains(tmp_path, monkeypatch):
    """An epoch's batches are chunk indices with their word counts until read: under DDP a process normalises by
    every process's words but encodes only its share. Pending and encoded batches give the same loss."""
    import torch

    from sanlab.runs.build import make_task
    from sanlab.tasks import tagging
    from sanlab.training.logging import SilentLogger

    run = tmp_path / "run"
    run.mkdir()
    task = make_task(make_tagging_config(tmp_path), run, SilentLogger(run))
    encoded = []
    real = tagging.encode_batch
    monkeypatch.setattr(tagging, "encode_batch", lambda *a, **k: encoded.append(1) or real(*a, **k))
    task.model.eval()  # (no dropout: the two losses are of one function)
    group = task.epoch_batches(0)[0:4]
    assert encoded == [] and all(isinstance(b, tagging.PendingTagBatch) for b in group)
    for pending in group:
        batch = task.read(pending)
        assert task.batch_tokens(pending) == batch.tokens == int(batch.tags.ne(-100).sum())
        torch.testing.assert_close(task.loss(pending), task.loss(batch), rtol=0, atol=0)


def test_outputs_that_go_non_finite_only_in_validation_stop_the_run_without_a_checkpoint(tmp_path, monkeypatch):
    """Training's loss stays finite; the tagger's outputs are NaN in eval mode only (so the dev accuracy is taken
    over NaN logits first): the dev loss stops the run, naming the update and what to try, and nothing is saved."""
    from sanlab.errors import TrainingError
    from sanlab.models.tagger import Tagger

    forward = Tagger.forward
    monkeypatch.setattr(Tagger, "forward", lambda self, *a, **k: forward(self, *a, **k) * (
        1.0 if self.training else float("nan")))
    run = tmp_path / "run"
    with pytest.raises(TrainingError, match=r"validation loss is nan after update 2: .*stopping without saving it\. "
                                            r"Last good checkpoint: none yet .* Try a lower learning rate"):
        train_run(make_tagging_config(tmp_path, max_steps=3, valid_every=2), run, quiet=True)
    assert (run / "meta.json").is_file() and not list(run.rglob("model.safetensors"))  # it ran; nothing saved
