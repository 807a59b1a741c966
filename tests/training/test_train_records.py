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
        seen.append(float(loss))
        return loss, tokens

    monkeypatch.setattr(loop.Trainer, "update", recording)
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=6, log_every=3), run, quiet=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [(r["step"], r["loss"]) for r in records if r["split"] == "train"]
    assert [s for s, _ in train] == [3, 6]
    assert [loss for _, loss in train] == pytest.approx([sum(seen[:3]) / 3, sum(seen[3:6]) / 3])


def test_train_record_gnorm_is_the_mean_gradient_norm_before_clipping(tmp_path, tiny_translation, monkeypatch):
    """fairseq's gnorm: each "train" record has the mean over its interval of the gradients' norm before clipping
    (here clipped at 0.5, far below it), read with the loss, not per update."""
    from sanlab.training import loop

    norms, clip = [], loop.Trainer._clip

    def recording(self):
        norm = clip(self)
        norms.append(float(norm))
        return norm

    monkeypatch.setattr(loop.Trainer, "_clip", recording)
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=6, log_every=3, clip_norm=0.5), run, quiet=True)
    train = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    assert [r["gnorm"] for r in train] == pytest.approx([sum(norms[:3]) / 3, sum(norms[3:6]) / 3])
    assert min(norms) > 0.5  # the norms before clipping, not the clipped 0.5


@pytest.mark.parametrize("task,precision", [("translation", "fp32"), ("translation", "fp16"), ("tagging", "fp32")])
def test_an_update_never_reads_the_host_and_the_loop_reads_once_per_log_record(tmp_path, tiny_translation,
                                                                               monkeypatch, task, precision):
    """Issue 24: nothing in an update waits for the device; the loss, the gradient norm and fp16's skipped
    updates are read together every ``log_every`` updates (and at validation). On the CPU a read is free, so
    ``HostReads`` records the operations that would wait on a GPU. Left out, as they read host tensors only:
    the tasks' reading of a batch (translation's collation, the tagger's encoding: Python lists to CPU tensors,
    then copied to the device) and torch's unfused AdamW, which reads its CPU step counters (CUDA runs the fused
    one, which reads nothing)."""
    from sanlab.tasks.tagging import TaggingTask
    from sanlab.tasks.translation import TranslationTask
    from sanlab.training import loop
    from tests_helpers import HostReads
    from training_fixtures import make_tagging_config

    update, settle = loop.Trainer.update, loop.Trainer.settle
    seen, reads, settled = HostReads(), [], []

    def watched_update(self, group):
        step = self.optimizer.step
        self.optimizer.step = lambda *a, **k: _ignored(step, *a, **k)
        with seen:
            result = update(self, group)
        reads.append(seen.reads())
        seen.events.clear()
        return result

    def _ignored(fn, *args, **kwargs):
        with seen.ignoring():
            return fn(*args, **kwargs)

    for task_class in (TranslationTask, TaggingTask):
        monkeypatch.setattr(task_class, "read", lambda self, batch, read=task_class.read: _ignored(read, self, batch))
    monkeypatch.setattr(loop.Trainer, "update", watched_update)
    monkeypatch.setattr(loop.Trainer, "settle", lambda self: settled.append(self.progress.step) or settle(self))
    make = tiny_translation if task == "translation" else lambda **train: make_tagging_config(tmp_path, **train)
    train_run(make(max_steps=8, log_every=4, valid_every=8, precision=precision), tmp_path / "run", quiet=True)
    if precision == "fp32":
        assert reads == [[]] * 8
    else:  # GradScaler.step reads its overflow flag before an unfused optimizer's step (not before CUDA's fused)
        assert reads == [["item"]] * 8
    epoch = 6 if task == "translation" else 8  # batches in an epoch (the tagger: 60 chunks / 8)
    # two log records, the end of an epoch; the validation settles again (nothing new, so no wait)
    assert settled == sorted({4, 8, epoch}) + [8]


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
    from sanlab.training.logging import read_metrics

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


def test_truncating_after_a_checkpoint_returns_the_last_update_the_dropped_records_name(tmp_path):
    """The resume drops the records an interrupted session logged past its checkpoint and says how far it had got
    (the records are the only trace of it); a torn last line is dropped too, and names its update if the kill
    came after the record's "step" was written."""
    from sanlab.training.logging import RunLogger
    from sanlab.training.logging import read_metrics

    log = RunLogger(tmp_path, tensorboard=False, quiet=True)
    metrics = tmp_path / "metrics.jsonl"
    for step in (50, 100, 150):
        log.scalars("train", {"loss": 1.0}, step=step)
    before = metrics.stat()
    assert log.truncate_after(150) is None  # nothing past the checkpoint: the file is left as it was
    assert (metrics.stat().st_ino, metrics.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    with open(metrics, "a") as f:
        f.write('{"split": "train", "st')  # killed before the record named its update
    assert log.truncate_after(150) is None
    assert [r["step"] for r in read_metrics(tmp_path)] == [50, 100, 150] and metrics.read_text().endswith("}\n")
    with open(metrics, "a") as f:
        f.write('{"split": "train", "step": 200, "ti')  # killed after it did: the session had got to update 200
    assert log.truncate_after(150) == 200
    assert [r["step"] for r in read_metrics(tmp_path)] == [50, 100, 150] and metrics.read_text().endswith("}\n")
    log.scalars("train", {"loss": 1.0}, step=200)
    log.scalars("train", {"loss": 1.0}, step=250)
    assert log.truncate_after(100) == 250
    assert [r["step"] for r in read_metrics(tmp_path)] == [50, 100]
    assert log.truncate_after(0) == 100 and read_metrics(tmp_path) == []


def test_a_console_that_is_not_a_terminal_gets_a_line_per_train_record_not_a_redrawn_bar(tmp_path, tiny_translation,
                                                                                        capsys):
    """In a batch job's log (stderr not a terminal) tqdm's bar would write each redraw, carriage returns and all;
    there each "train" record is one plain line instead, with the numbers the bar shows (fairseq's simple format)."""
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=6, log_every=3, progress=True), run)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if " batches, step " in line]
    assert len(lines) == 2 and "\r" not in err, err
    assert lines[0].split("] ", 1)[1].startswith("epoch 0: ") and ", step 3, loss " in lines[0]
    assert all(f" {key} " in line for line in lines for key in ("gnorm", "lr", "tok_s"))


@pytest.mark.parametrize("seconds, shown", [(0.0, "<0.1s"), (0.04, "<0.1s"), (0.4, "0.4s"), (9.94, "9.9s"),
                                            (9.96, "10s"), (125.4, "125s")])
def test_a_wall_time_is_shown_true_below_ten_seconds(seconds, shown):
    """A session of 0.4 s was logged as "(0s this session)"; below 10 s it gets a tenth, below 0.1 s "<0.1s".
    The one formatter of the durations printed (a session, a grid's cell, the demo)."""
    from sanlab.training.logging import duration

    assert duration(seconds) == shown


def test_the_last_log_line_of_a_session_uses_that_wall_time(tmp_path, tiny_translation):
    import re

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=1), run, quiet=True)
    finished = [line for line in (run / "train.log").read_text().splitlines() if "finished at step" in line]
    assert len(finished) == 1 and re.search(r"\((<0\.1|\d\.\d|\d{2,})s this session\)", finished[0]), finished
