"""The task registry and the ``Task`` interface of translation and tagging (docs/tasks.md). A plug-in task taken
through the commands end to end: tests/test_third_task.py."""

import numpy as np
import pytest

from sanlab.config import TASKS, TaggingConfig, TranslationConfig, validate
from sanlab.errors import ConfigError
from sanlab.registry import TaskRegistry
from sanlab.tasks.base import Task, task_for, task_named


def test_each_config_has_its_task():
    translation = validate({"task": "translation", "data": {"train": {"src": "a", "tgt": "b"},
                                                             "valid": {"src": "c", "tgt": "d"}}}, source="t")
    tagging = validate({"task": "tagging", "data": {"train": "a", "dev": "b", "test": "c"}}, source="t")
    assert isinstance(translation, TranslationConfig) and isinstance(tagging, TaggingConfig)
    mt, tag = task_for(translation), task_for(tagging)
    assert isinstance(mt, Task) and (mt.name, mt.metric, mt.default_split(translation)) == ("translation", "bleu", "valid")
    assert (tag.name, tag.metric, tag.eval_metric, tag.splits(tagging)) == ("tagging", "accuracy", "all", ["dev", "test"])
    assert task_named("tagging") is tag and mt.training_files(translation) == ["a", "b", "c", "d"]
    assert TASKS.names() == ["tagging", "translation"]


def test_a_command_of_another_task_names_the_tasks_that_have_it():
    with pytest.raises(ConfigError, match=r"runs/x is a tagging run; `sanlab translate` needs a translation run "
                                          r"\(use `sanlab tag`\)"):
        task_named("tagging").require("translate", "runs/x")
    task_named("translation").require("translate", "runs/x")
    with pytest.raises(ConfigError, match=r"a tagging config; `sanlab prepare` needs a translation config$"):
        task_named("tagging").require("prepare", "c.yaml", what="config")  # no `sanlab tag` advice: it is no answer
    with pytest.raises(ConfigError, match=r"`sanlab prepare` needs a translation config \(train it directly\)"):
        task_named("tagging").require("prepare", "c.yaml", what="config", instead="train it directly")


def test_a_config_without_a_task_says_so():
    with pytest.raises(ConfigError, match=r"c.yaml: no `task:` \(.*translation.*\).*; it is empty"):
        validate({}, source="c.yaml")
    with pytest.raises(ConfigError, match=r"no `task:` .*; its keys: model, train"):
        validate({"model": {}, "train": {}}, source="c.yaml")


def test_an_unknown_task_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"task: unknown task 'copy' \(known: translation, tagging\)"):
        validate({"task": "copy"}, source="t")


@pytest.mark.parametrize("reference, problem", [
    ("sanlab.config:TranslationConfig", "must be the name it is registered under"),
    ("sanlab.config:TrainConfig", "a pydantic model with a task field"),
    ("sanlab.config:TaskConfig", "must be the name it is registered under"),
])
def test_a_malformed_task_entry_is_refused_with_its_name(reference, problem):
    registry = TaskRegistry("task", group="sanlab.tests-no-such-group", builtin={"mine": reference})
    with pytest.raises(ConfigError, match=f"task 'mine'.*{problem}"):
        registry.entry("mine")


@pytest.mark.parametrize("task, key, value", [("tagging", "max_tokens", 2000), ("tagging", "valid_max_sentences", 20),
                                              ("translation", "batch_size", 64)])
def test_a_train_key_only_the_other_task_reads_is_refused_unless_at_its_default(task, key, value):
    data = ({"train": "a.conllu", "dev": "b.conllu"} if task == "tagging" else
            {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"}})
    with pytest.raises(ConfigError, match=f"train.{key} is {value}, but a {task} run does not read it"):
        validate({"task": task, "data": data, "train": {key: value}}, source="c.yaml")
    default = validate({"task": task, "data": data}, source="c.yaml").train
    validate({"task": task, "data": data, "train": {key: getattr(default, key)}}, source="c.yaml")  # a dumped config


def test_a_run_config_written_before_the_rule_loads_without_the_key_its_run_ignored(tmp_path):
    """A tagging run trained with train.max_tokens: 2000 (silently ignored then) still evaluates and resumes."""
    import yaml

    from sanlab.runs.resume import load_run_config

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(
        {"task": "tagging", "data": {"train": "a.conllu", "dev": "b.conllu"},
         "train": {"max_tokens": 2000, "seed": 4}}))
    train = load_run_config(tmp_path).train
    assert (train.max_tokens, train.seed) == (4096, 4)


@pytest.mark.parametrize("task, train, said", [
    ("tagging", {"betas": [0.5, 0.5]}, "train.betas is (0.5, 0.5), but train.optimizer is rmsprop, and only adam"),
    ("translation", {"rmsprop_alpha": 0.5}, "train.rmsprop_alpha is 0.5, but train.optimizer is adam"),
    ("tagging", {"warmup_init_lr": 0.5}, "train.warmup_init_lr is 0.5, but train.warmup_steps is 0"),
    ("translation", {"compile_backend": "eager"}, "train.compile_backend is eager, but train.compile is false"),
    ("translation", {"compile_dynamic": False}, "train.compile_dynamic is False, but train.compile is false")])
def test_a_train_key_the_other_settings_leave_unread_is_refused(task, train, said, tmp_path):
    """Values that would silently do nothing (an optimizer's setting under the other one, ...) are refused; at
    their defaults (as a dumped config has them) or where read, they are taken; a run directory's config
    written before the rule loads with them dropped."""
    import yaml

    from sanlab.runs.resume import load_run_config

    data = ({"train": "a.conllu", "dev": "b.conllu"} if task == "tagging" else
            {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"}})
    import re

    with pytest.raises(ConfigError, match=re.escape(said)):
        validate({"task": task, "data": data, "train": train}, source="c.yaml")
    key = next(iter(train))
    default = validate({"task": task, "data": data}, source="c.yaml").train
    validate({"task": task, "data": data, "train": {key: getattr(default, key)}}, source="c.yaml")
    reads = {"betas": {"optimizer": "adam"}, "rmsprop_alpha": {"optimizer": "rmsprop"},
             "warmup_init_lr": {"warmup_steps": 10}, "compile_backend": {"compile": True},
             "compile_dynamic": {"compile": True}}[key]
    validate({"task": task, "data": data, "train": {**train, **reads}}, source="c.yaml")
    run = tmp_path
    (run / "config.yaml").write_text(yaml.safe_dump({"task": task, "data": data, "train": {**train, "seed": 4}}))
    loaded = load_run_config(run).train
    assert (getattr(loaded, key), loaded.seed) == (getattr(default, key), 4)


@pytest.mark.parametrize("model", [{"positions": "learned"},
                                   {"encoder": {"layers": 1, "ffn_dim": 16,
                                                "attention": {"heads": 2, "parts": [{"type": "abs_position"}]}}}],
                         ids=["learned-positions", "fixed-length-part"])
def test_padding_to_a_multiple_stops_at_the_models_positions(model):
    """max_len 100 + EOS rounded up to 104 under compile would index position 103 of a 101-row table (a learned
    position table, or a part of fixed length t = max_positions): the batch is padded to 101 instead."""
    import torch

    from sanlab.data.batching import padded_width
    from sanlab.data.subword import SubwordPair
    from sanlab.models.builders import build_seq2seq
    from sanlab.tasks import translation

    data = {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"}, "max_len": 100}
    small = {"dim": 8, "max_positions": 101, "dropout": 0.0,
             "encoder": {"layers": 1, "ffn_dim": 16, "attention": {"heads": 2}},
             "decoder": {"layers": 1, "ffn_dim": 16, "attention": {"heads": 2}}}
    config = validate({"task": "translation", "data": data, "model": {**small, **model}, "train": {"compile": True}},
                      source="c.yaml")
    assert config.train.length_multiple == 8 and padded_width(101, 8, at_most=101) == 101
    assert padded_width(97, 8, at_most=101) == 101 and padded_width(90, 8, at_most=101) == 96
    assert padded_width(102, 8, at_most=101) == 102  # never cut: a sequence too long is the model's to refuse
    # the training batches of TranslationTask.read: 100 tokens + EOS (source, target out) or BOS (target in); the
    # task is made without its constructor (which prepares a corpus) and given just what read() uses
    task = translation.TranslationTask.__new__(translation.TranslationTask)
    task.config, task.spm = config, SubwordPair.__new__(SubwordPair)
    task.spm.pad_id, task.spm.bos_id, task.spm.eos_id = 0, 1, 2
    task.train = type("Corpus", (), {"pair": lambda self, k: (np.full(100 if k == 0 else 5, 3),) * 2})()
    batch = task.read(translation.PendingBatch(np.array([0, 1]), 0))
    assert batch.src.shape == batch.tgt_in.shape == batch.tgt_out.shape == (2, 101)
    logits = build_seq2seq(config.model, vocab_size=10, pad_id=0)(batch.src, batch.tgt_in)
    assert logits.shape == (2, 101, 10) and torch.isfinite(logits).all()


@pytest.mark.parametrize("task, data", [
    ("translation", {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"}}),
    ("tagging", {"train": "a.conllu", "dev": "b.conllu"})])
def test_a_seed_out_of_range_is_refused_before_training(task, data):
    """numpy's generators (the translation batch order) refuse a negative seed, torch.manual_seed one past 2^64 - 1
    (and a data-parallel rank seeds seed * 1_000_003 + rank): found when the config is read, not at the first epoch
    or on rank 1 (one rule for both tasks)."""
    with pytest.raises(ConfigError, match="train.seed: Input should be greater than or equal to 0"):
        validate({"task": task, "data": data, "train": {"seed": -1}}, source="c.yaml")
    with pytest.raises(ConfigError, match="train.seed: Input should be less than or equal to 4294967295"):
        validate({"task": task, "data": data, "train": {"seed": 2**32}}, source="c.yaml")
    assert validate({"task": task, "data": data, "train": {"seed": 2**32 - 1}}, source="c.yaml").train.seed == 2**32 - 1
    import torch

    torch.manual_seed((2**32 - 1) * 1_000_003 + 7)   # the largest seed a rank takes is one torch accepts


def test_filter_valid_applies_the_training_length_filter_to_validation_only_when_asked(tmp_path):
    """``data.filter_valid`` (the capsule paper's WMT17 setup): validation pairs beyond data.max_len are dropped, and
    train.log says how many were kept; by default validation keeps every pair; a filter that leaves none is an error
    naming the validation file."""
    from sanlab.config import validate
    from sanlab.errors import DataError
    from sanlab.runs import make_task
    from sanlab.training.logging import RunLogger
    from training_fixtures import make_reverse_config

    raw = make_reverse_config(tmp_path).model_dump(mode="json")
    raw["data"]["max_len"] = 5
    whole = make_task(validate(raw, source="t"), tmp_path / "a", RunLogger(tmp_path / "a", progress=False, quiet=True))
    raw["data"]["filter_valid"] = True
    run = tmp_path / "b"
    task = make_task(validate(raw, source="t"), run, RunLogger(run, progress=False, quiet=True))
    kept = [k for k, pair in enumerate(whole.valid) if max(map(len, pair)) <= 5]
    assert 0 < len(kept) < len(whole.valid)
    assert task.valid == [whole.valid[k] for k in kept] and task.valid_raw == [whole.valid_raw[k] for k in kept]
    assert f"validation pairs: {len(kept)} of {len(whole.valid)} kept within data.max_len 5 (data.filter_valid)" in \
        (run / "train.log").read_text()
    for side in ("src", "tgt"):  # validation pairs all beyond the filter
        (tmp_path / f"long.{side}").write_text(" ".join(["a b c"] * 10) + "\n")
    raw["data"]["valid"] = {"src": str(tmp_path / "long.src"), "tgt": str(tmp_path / "long.tgt")}
    with pytest.raises(DataError, match="long.src: no validation pair has 1 to data.max_len 5 subword tokens"):
        make_task(validate(raw, source="t"), tmp_path / "c", RunLogger(tmp_path / "c", progress=False, quiet=True))


def test_word_group_sizes_of_cells_counted_under_other_definitions():
    """Records of the old definitions (None where a count is now kept) beside newer ones: said, not a TypeError
    from sorting None against a number."""
    from types import SimpleNamespace

    from sanlab.tasks.tagging_task import GROUP_COUNTS, word_group_sizes

    new = dict(zip(GROUP_COUNTS, (100, 10, 0, 30, 60)))
    old = {**new, GROUP_COUNTS[2]: None}
    results = {"a": SimpleNamespace(scores=new), "b": SimpleNamespace(scores=old), "c": SimpleNamespace(scores={})}
    assert "the cells count them differently" in word_group_sizes(results, split="test")
    said = word_group_sizes({"a": results["a"]}, split="test")
    assert said.startswith("Word groups (test tokens): all 100 = OOV 10 (10.0%)")


def test_a_warm_up_start_with_a_one_update_warm_up_is_refused():
    """Update n runs at the schedule's rate at n (1-based), so with train.warmup_steps 1 the first update already
    runs at train.lr and warmup_init_lr is never used (fairseq would run update 1 at it): refused, as at 0."""
    data = {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"}}
    with pytest.raises(ConfigError, match=r"train.warmup_init_lr is 0.5, but train.warmup_steps is 1 \(the first "
                                          r"update already runs at train.lr"):
        validate({"task": "translation", "data": data, "train": {"warmup_steps": 1, "warmup_init_lr": 0.5}},
                 source="c.yaml")
    validate({"task": "translation", "data": data, "train": {"warmup_steps": 2, "warmup_init_lr": 0.5}},
             source="c.yaml")
