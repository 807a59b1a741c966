"""What metrics.jsonl says about training: the train loss of a record is the mean of its interval."""

import json

import pytest
import torch

from sanlab.runs import train_run


def test_train_loss_record_is_the_mean_over_the_updates_since_the_last_one(tmp_path, tiny_translation, monkeypatch):
    from sanlab.training import loop

    seen, update = [], loop.Trainer.update

    def recording(self, group):
        loss, tokens = update(self, group)
        seen.append(loss)
        return loss, tokens

    monkeypatch.setattr(loop.Trainer, "update", recording)
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=6, log_every=3), run, quiet=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [(r["step"], r["loss"]) for r in records if r["split"] == "train"]
    assert [s for s, _ in train] == [3, 6]
    assert [loss for _, loss in train] == pytest.approx([sum(seen[:3]) / 3, sum(seen[3:6]) / 3])


def test_tagging_dev_loss_is_the_nll_whatever_the_training_label_smoothing(tmp_path):
    import torch.nn.functional as F

    from sanlab.config import validate
    from sanlab.data.synthetic import write_tagging_corpus
    from sanlab.tasks.tagging import TaggingTask, encode_batch
    from sanlab.training.logging import SilentLogger

    data = tmp_path / "data"
    write_tagging_corpus(data, seed=2, sizes={"train": 60, "dev": 20, "test": 20})
    config = validate({"task": "tagging", "data": {"train": str(data / "train.conllu"), "dev": str(data / "dev.conllu")},
                       "model": {"word_dim": 16, "char_dim": 8, "char_filters": 8, "char_layers": 1,
                                 "encoder": {"layers": 1}},
                       "train": {"label_smoothing": 0.4, "progress": False}}, source="test")
    (tmp_path / "run").mkdir()
    task = TaggingTask(config, tmp_path / "run", SilentLogger(tmp_path / "run"))
    batch = encode_batch(task.vocab, task.dev, max_chars=config.model.max_word_chars)
    with torch.no_grad():
        logits = task.model.eval()(batch.words, batch.chars).flatten(0, 1)
        nll, smoothed = (F.cross_entropy(logits, batch.tags.flatten(), ignore_index=-100, reduction="sum",
                                         label_smoothing=ls) for ls in (0.0, 0.4))
        assert task.dev_loss() == pytest.approx(float(nll) / batch.tokens, rel=1e-5)
        assert float(task.loss(batch)) == pytest.approx(float(smoothed))  # training: the smoothed objective
        assert abs(float(smoothed) - float(nll)) > 1.0


def test_without_the_padding_mask_a_chunk_is_tagged_alike_whatever_its_batch(tmp_path):
    # the reference pads every chunk to t and attends over the padding (spec C.10); padding to the batch's
    # longest chunk instead made a sentence's tags depend on its batch neighbours
    from sanlab.config import validate
    from sanlab.data.conllu_io import TaggedSentence
    from sanlab.data.synthetic import write_tagging_corpus
    from sanlab.tasks.tagging import PAD_WORD, TaggingTask, encode_batch
    from sanlab.training.logging import SilentLogger

    data = tmp_path / "data"
    write_tagging_corpus(data, seed=2, sizes={"train": 60, "dev": 20, "test": 20})
    config = validate({"task": "tagging", "data": {"train": str(data / "train.conllu"), "dev": str(data / "dev.conllu")},
                       "model": {"word_dim": 16, "char_dim": 8, "char_filters": 8, "char_layers": 1, "max_len": 12,
                                 "mask_padding": False, "encoder": {"layers": 1}}}, source="test")
    (tmp_path / "run").mkdir()
    task = TaggingTask(config, tmp_path / "run", SilentLogger(tmp_path / "run"))
    model, vocab, max_chars = task.model.eval(), task.vocab, config.model.max_word_chars
    short = TaggedSentence(("a", "b", "c"), ("X", "X", "X"))
    long = TaggedSentence(tuple("abcdefghij"), ("X",) * 10)
    alone = encode_batch(vocab, [short], max_chars=max_chars, pad_to=model.pad_to)
    paired = encode_batch(vocab, [short, long], max_chars=max_chars, pad_to=model.pad_to)
    assert alone.words.shape == (1, 12) and model.pad_to == 12
    assert alone.chars[0, 5, :5].tolist() == [vocab.char_id.get(c, 1) for c in PAD_WORD]  # padding spelled <PAD>
    with torch.no_grad():
        torch.testing.assert_close(model(alone.words, alone.chars)[0], model(paired.words, paired.chars)[0])


def test_a_record_torn_by_a_kill_is_skipped_and_the_next_starts_a_new_line(tmp_path):
    from sanlab.errors import ConfigError
    from sanlab.training.logging import RunLogger
    from sanlab.training.loop import read_metrics

    log = RunLogger(tmp_path, tensorboard=False, quiet=True)
    log.scalars("valid", {"bleu": 1.0}, step=1)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"split": "valid", "step": 2, "bl')  # the process died here
    log.scalars("valid", {"bleu": 3.0}, step=3)
    assert [(r["step"], r["bleu"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (3, 3.0)]
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write("not json at all\n")
    with pytest.raises(ConfigError, match=r"metrics\.jsonl:4: not a JSON record"):
        read_metrics(tmp_path)
