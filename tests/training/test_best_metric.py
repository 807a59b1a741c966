"""train.best_metric (fairseq's --best-checkpoint-metric): the validation metric that picks the `best` checkpoints
(train.keep_best, --checkpoint best) and counts train.patience, with its direction (loss and ppl lower is better);
unset, the task's own (translation: bleu, tagging: accuracy)."""

import json
import math

import pytest

from sanlab.config import TrainConfig, validate
from sanlab.errors import ConfigError, TrainingError

TRANSLATION_DATA = {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"}}
TAGGING_DATA = {"train": "a.conllu", "dev": "b.conllu"}


def _config(task: str, **train):
    return validate({"task": task, "data": TRANSLATION_DATA if task == "translation" else TAGGING_DATA,
                     "train": train}, source="c.yaml")


@pytest.mark.parametrize("task, train, chosen", [
    ("translation", {}, ("bleu", True)), ("translation", {"best_metric": "bleu"}, ("bleu", True)),
    ("translation", {"best_metric": "loss"}, ("loss", False)), ("translation", {"best_metric": "ppl"}, ("ppl", False)),
    ("tagging", {}, ("accuracy", True)), ("tagging", {"best_metric": "loss"}, ("loss", False)),
])
def test_the_metric_and_its_direction_follow_train_best_metric_or_the_tasks_own(task, train, chosen):
    from sanlab.tasks.base import task_for

    config = _config(task, **train)
    assert task_for(config).best_metric(config) == chosen


@pytest.mark.parametrize("task, metric, allowed", [
    ("translation", "accuracy", "bleu, loss or ppl"), ("translation", "BLEU", "bleu, loss or ppl"),
    ("tagging", "bleu", "accuracy or loss"), ("tagging", "oov", "accuracy or loss"),
])
def test_a_metric_the_tasks_validation_does_not_give_is_a_config_error_naming_those_it_does(task, metric, allowed):
    with pytest.raises(ConfigError, match=rf"train\.best_metric is '{metric}', but a {task} run's validation gives "
                                          rf"{allowed}"):
        _config(task, best_metric=metric)


def test_every_tasks_own_metric_is_one_train_best_metric_may_name_with_the_same_direction():
    """The config's table (config layer, read without torch) and the task's default (``Task.metric``) agree."""
    from sanlab.config import TASKS
    from sanlab.tasks.base import task_named

    for name in ("translation", "tagging"):
        task = task_named(name)
        assert TASKS.entry(name).config.best_metrics[task.metric] is task.higher_is_better, name


def test_no_bleu_at_validation_needs_another_best_metric():
    """valid_max_sentences 0: validation decodes nothing (the loss only, fairseq's default cost), so BLEU cannot
    pick the best checkpoint."""
    for train in ({"valid_max_sentences": 0}, {"valid_max_sentences": 0, "best_metric": "bleu"}):
        with pytest.raises(ConfigError, match=r"train\.valid_max_sentences is 0 .*no BLEU.*train\.best_metric"):
            _config("translation", **train)
    assert _config("translation", valid_max_sentences=0, best_metric="loss").train.valid_max_sentences == 0
    with pytest.raises(ConfigError, match=r"train\.valid_max_sentences"):
        _config("translation", valid_max_sentences=-1, best_metric="loss")


def test_a_trainer_whose_task_ignores_train_best_metric_is_refused(tmp_path):
    """The loop reads the metric from the training task (``TrainTask.metric``): one built without following the
    config's train.best_metric would select by another metric than the config says."""
    from torch import nn

    from sanlab.training.logging import SilentLogger
    from sanlab.training.loop import Trainer

    class Task:
        metric, higher_is_better = "accuracy", True
        model = nn.Linear(2, 2)

    with pytest.raises(TrainingError, match=r"train\.best_metric is 'loss', but the training task selects by accuracy"):
        Trainer(task=Task(), config=TrainConfig(best_metric="loss"), run_dir=tmp_path / "run",
                logger=SilentLogger(tmp_path / "run"))


# scripted validations, one per update (valid_every 1): BLEU peaks at update 3, the loss is lowest at update 4
LOSSES = [3.0, 2.0, 2.5, 1.5, 2.2]
BLEUS = [1.0, 5.0, 9.0, 2.0, 7.0]


def _scripted(monkeypatch, losses, bleus):
    from sanlab.tasks.translation import TranslationTask

    scores = iter(zip(losses, bleus))

    def validate(self):
        loss, bleu = next(scores)
        return {"loss": loss, "ppl": math.exp(loss), "bleu": bleu}

    monkeypatch.setattr(TranslationTask, "validate", validate)


def _kept(run) -> dict[int, dict]:
    metas = [json.loads(p.read_text()) for p in sorted((run / "checkpoints").glob("step-*/meta.json"))]
    return {m["step"]: m for m in metas}


@pytest.mark.parametrize("best_metric, best_step, best", [("loss", 4, "1.5"), (None, 3, "9")])
def test_best_checkpoints_are_kept_and_chosen_by_the_chosen_metric(tmp_path, tiny_translation, monkeypatch,
                                                                 best_metric, best_step, best):
    from sanlab.runs import train_run
    from sanlab.runs.trained import select_checkpoint

    _scripted(monkeypatch, LOSSES, BLEUS)
    config = tiny_translation(max_steps=5, valid_every=1, keep_best=1, keep_last=1,
                              **({"best_metric": best_metric} if best_metric else {}))
    run = tmp_path / "run"
    summary = train_run(config, run, quiet=True)
    kept = _kept(run)
    assert sorted(kept) == [best_step, 5]  # keep_best 1 by the chosen metric, keep_last 1
    metric = best_metric or "bleu"
    assert all(m["score"] == m["metrics"][metric] for m in kept.values())
    assert select_checkpoint(run, "best", config).name == f"step-{best_step:08d}"
    assert f"{summary['best']:.4g}" == best
    finished = (run / "train.log").read_text().splitlines()[-1]
    assert f"finished at step 5, epoch 0, best {metric} {best} " in finished


def test_patience_counts_validations_without_a_lower_loss(tmp_path, tiny_translation, monkeypatch):
    """BLEU rises at every validation, the loss stops falling after update 2: by loss, patience 2 stops at 4."""
    from sanlab.runs import train_run

    _scripted(monkeypatch, [3.0, 2.0, 2.5, 2.1, 1.0, 0.5], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    run = tmp_path / "run"
    summary = train_run(tiny_translation(max_steps=6, valid_every=1, patience=2, best_metric="loss"), run, quiet=True)
    assert (summary["step"], summary["bad_validations"], summary["best"]) == (4, 2, 2.0)
    log = (run / "train.log").read_text()
    assert "stopped early, 2 validations without a better loss (train.patience = 2)" in log
    assert "step 3 epoch 0: loss 2.5, ppl 12.18, bleu 3 (best 2, 1 without gain)" in log


def test_a_loss_only_validation_decodes_nothing_and_selects_by_loss(tmp_path, tiny_translation):
    from sanlab.runs import train_run
    from sanlab.training.logging import read_metrics

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=4, valid_every=2, valid_max_sentences=0, best_metric="ppl"), run, quiet=True)
    valid = [r for r in read_metrics(run) if r.get("split") == "valid"]
    assert [r["step"] for r in valid] == [2, 4] and all("bleu" not in r and "loss" in r for r in valid)
    kept = _kept(run)
    assert [m["score"] for m in kept.values()] == [m["metrics"]["ppl"] for m in kept.values()]
    assert all(set(m["metrics"]) == {"loss", "ppl"} for m in kept.values())


def test_resuming_with_another_best_metric_is_refused_and_the_tasks_own_spelled_out_is_not_another(
        tmp_path, tiny_translation):
    """The saved checkpoints' scores, `best` and the patience counter are of the metric the run trained with."""
    from sanlab.runs import train_run

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=2), run, quiet=True)
    with pytest.raises(ConfigError, match=r"differing keys: train\.best_metric\."):
        train_run(tiny_translation(max_steps=4, valid_every=2, best_metric="loss"), run, quiet=True)
    assert train_run(tiny_translation(max_steps=4, valid_every=2, best_metric="bleu"), run, quiet=True)["step"] == 4
    with pytest.raises(ConfigError, match=r"differing keys: train\.best_metric\."):
        train_run(tiny_translation(max_steps=6, valid_every=2, best_metric="ppl"), run, quiet=True)


def test_config_differences_compare_the_metric_an_unset_best_metric_means():
    from sanlab.runs import config_differences

    default, bleu, loss = (_config("translation", **t).model_dump(mode="json")
                           for t in ({}, {"best_metric": "bleu"}, {"best_metric": "loss"}))
    assert config_differences(default, bleu) == [] and config_differences(bleu, default) == []
    assert config_differences(default, loss) == ["train.best_metric"]
    tagging = _config("tagging").model_dump(mode="json")
    assert config_differences(tagging, _config("tagging", best_metric="accuracy").model_dump(mode="json")) == []


def test_a_tagger_selects_by_dev_loss_when_asked(tmp_path):
    from sanlab.runs import train_run
    from training_fixtures import make_tagging_config

    run = tmp_path / "run"
    train_run(make_tagging_config(tmp_path, max_epochs=2, best_metric="loss"), run, quiet=True)
    kept = _kept(run)
    assert len(kept) == 2 and all(m["score"] == m["metrics"]["loss"] for m in kept.values())
    assert "best loss" in (run / "train.log").read_text().splitlines()[-1]


def test_the_cli_names_the_chosen_metric(tmp_path, tiny_translation, capsys):
    import re

    from sanlab.cli import main
    from sanlab.config import dump_config

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(dump_config(tiny_translation(max_steps=2, valid_every=2, best_metric="loss")))
    assert main(["train", str(recipe), "--run", str(tmp_path / "run"), "--quiet"]) == 0
    assert re.fullmatch(r"done: step 2, best loss [0-9.e+-]{1,6}\n", capsys.readouterr().out)


def test_an_analysis_scores_a_run_by_its_best_validation_of_the_metric_it_selects_by(tmp_path, tiny_translation):
    """`sanlab analyze sweep` / `curves` without --metric: the best validation record is that of `best`."""
    from sanlab.experiments import analyze
    from sanlab.runs import prepare_run_dir

    run = tmp_path / "run"
    prepare_run_dir(run, tiny_translation(best_metric="loss"), overwrite=False)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"split": "valid", "step": step, "loss": loss, "bleu": bleu})
                                               + "\n" for step, loss, bleu in ((2, 3.0, 4.0), (4, 2.0, 1.0))))
    assert analyze.run_score(run, metric=None, score_from="valid", split=None, checkpoint="best") == \
        (2.0, "valid loss, step 4")
    assert analyze.run_score(run, metric="bleu", score_from="valid", split=None, checkpoint="best") == \
        (4.0, "valid bleu, step 2")
