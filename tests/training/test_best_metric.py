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
                                          rf"{allowed}") as err:
        _config(task, best_metric=metric)
    assert ("did you mean 'bleu'?" in str(err.value)) is (metric == "BLEU")


@pytest.mark.parametrize("task, metric, meant", [("translation", "Loss", "loss"), ("tagging", "ACCURACY", "accuracy")])
def test_a_metric_named_right_but_for_case_is_refused_with_its_exact_name(task, metric, meant):
    """Not taken as the metric it means: the saved config keeps the one spelling (a resume compares it)."""
    with pytest.raises(ConfigError, match=rf"train\.best_metric is '{metric}', .*: did you mean '{meant}'\? \(metric "
                                          r"names are case-sensitive\)"):
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
    assert "step 3 epoch 0: loss 2.5, ppl 12.18, bleu 3 (best loss 2, 1 without gain)" in log  # not BLEU 2


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
    # (a run of a recipe that chose its metric later, e.g. IWSLT14's loss: docs/training.md's upgrade note)
    with pytest.raises(ConfigError, match=r"differing keys: train\.best_metric\. .*it picks its best checkpoints by "
                                          r"bleu: add --set train\.best_metric=bleu to resume it"):
        train_run(tiny_translation(max_steps=4, valid_every=2, best_metric="loss"), run, quiet=True)
    assert train_run(tiny_translation(max_steps=4, valid_every=2, best_metric="bleu"), run, quiet=True)["step"] == 4
    with pytest.raises(ConfigError, match=r"differing keys: train\.best_metric\."):
        train_run(tiny_translation(max_steps=6, valid_every=2, best_metric="ppl"), run, quiet=True)


def test_the_best_metric_hint_names_the_other_keys_too_when_they_differ(tmp_path, tiny_translation):
    """Where other keys block the resume too, setting train.best_metric alone would not resume the run: the hint
    says to set them back as well (it said "add --set train.best_metric=bleu to resume it" whatever else differed)."""
    from sanlab.runs import prepare_run_dir

    run = tmp_path / "run"
    prepare_run_dir(run, tiny_translation(), overwrite=False)
    with pytest.raises(ConfigError, match="differing keys: train.best_metric, train.lr") as refused:
        prepare_run_dir(run, tiny_translation(best_metric="loss", lr=0.01), overwrite=False)
    assert "bleu to resume it" not in str(refused.value)
    assert str(refused.value).endswith("(it picks its best checkpoints by bleu: to resume it, set the other keys "
                                       "back as it trained and add --set train.best_metric=bleu)")


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


def _scored_run(root, name, config, records):
    from sanlab.runs import prepare_run_dir

    run = root / name
    prepare_run_dir(run, config, overwrite=False)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"split": "valid", "step": step, **metrics}) + "\n"
                                               for step, metrics in records))
    return run


# two validations: BLEU peaks at step 2, the loss is lowest at step 4
RECORDS = ((2, {"loss": 3.0, "bleu": 4.0}), (4, {"loss": 2.0, "bleu": 1.0}))


def test_an_analysis_of_runs_that_select_by_different_metrics_needs_metric(tmp_path, tiny_translation):
    """Without --metric each run would be scored by the first run's metric, so the table would depend on the
    order the runs are named in: refused, naming each run's metric; --metric picks one for all."""
    from sanlab.experiments import analyze

    by_loss = _scored_run(tmp_path, "by-loss", tiny_translation(lr=0.001, best_metric="loss"), RECORDS)
    by_bleu = _scored_run(tmp_path, "by-bleu", tiny_translation(lr=0.002), RECORDS)
    refusal = r"by different metrics \(.*by-(loss|bleu): (loss|bleu); .*by-(bleu|loss): (bleu|loss)\).*--metric"
    for runs in ([by_loss, by_bleu], [by_bleu, by_loss]):
        with pytest.raises(ConfigError, match=refusal):
            analyze.sweep(runs, key="train.lr", out=tmp_path / "sweep")
        with pytest.raises(ConfigError, match=refusal):
            analyze.curves(runs, out=tmp_path / "curves")
    with pytest.raises(ConfigError, match=refusal):  # the baseline is scored by the same metric as the runs
        analyze.sweep([by_loss], key="train.lr", out=tmp_path / "sweep", baseline=by_bleu)
    table = (analyze.sweep([by_bleu, by_loss], key="train.lr", out=tmp_path / "bleu", metric="bleu")["csv"]).read_text()
    assert table.count("valid bleu, step 2") == 2
    both_by_loss = _scored_run(tmp_path, "also-by-loss", tiny_translation(lr=0.003, best_metric="loss"), RECORDS)
    table = analyze.sweep([by_loss, both_by_loss], key="train.lr", out=tmp_path / "loss")["csv"].read_text()
    assert table.count("valid loss, step 4") == 2


def test_the_best_validation_record_follows_the_direction_the_task_declares(tmp_path, tiny_translation,
                                                                           monkeypatch):
    """A task's config class declares each metric's direction (``best_metrics``; a plug-in task's ``wer``, lower is
    better): the analyses take it from there, the name rule (loss, ppl) only for a metric outside the table."""
    from sanlab.config import TranslationConfig
    from sanlab.evaluation import analysis_curves
    from sanlab.experiments import analyze

    records = [{"split": "valid", "step": 2, "wer": 30.0}, {"split": "valid", "step": 4, "wer": 20.0}]
    assert analysis_curves.best_validation(records, metric="wer", higher_is_better=False) == (4, 20.0)
    assert analysis_curves.best_validation(records, metric="wer", higher_is_better=True) == (2, 30.0)
    assert analysis_curves.best_validation(records, metric="wer") == (2, 30.0)  # outside every table: max
    assert analysis_curves.best_validation([{**r, "loss": r["wer"]} for r in records], metric="loss") == (4, 20.0)

    monkeypatch.setattr(TranslationConfig, "best_metrics", {**TranslationConfig.best_metrics, "wer": False})
    run = _scored_run(tmp_path, "by-wer", tiny_translation(best_metric="wer"),
                      [(2, {"loss": 3.0, "bleu": 4.0, "wer": 30.0}), (4, {"loss": 2.0, "bleu": 1.0, "wer": 20.0})])
    assert analyze.run_score(run, metric=None, score_from="valid", split=None, checkpoint="best") == \
        (20.0, "valid wer, step 4")
    monkeypatch.setattr(TranslationConfig, "best_metrics", {**TranslationConfig.best_metrics, "loss": True})
    assert analyze.run_score(run, metric="loss", score_from="valid", split=None, checkpoint="best") == \
        (3.0, "valid loss, step 2")  # the table's direction, not the name's


def test_a_tasks_own_metric_is_scored_in_the_tasks_own_direction(tmp_path, tiny_translation, monkeypatch):
    """A task (a plug-in's) whose own metric is lower-is-better and not in its config class's best_metrics: the
    analyses take the task's declared direction, not the name rule (which took the highest WER)."""
    from sanlab.experiments import analyze
    from sanlab.tasks.translation_task import Translation

    monkeypatch.setattr(Translation, "metric", "wer")
    monkeypatch.setattr(Translation, "higher_is_better", False)
    run = _scored_run(tmp_path, "by-wer", tiny_translation(), [(2, {"wer": 30.0}), (4, {"wer": 20.0})])
    assert analyze.run_score(run, metric=None, score_from="valid", split=None, checkpoint="best") == \
        (20.0, "valid wer, step 4")


def test_the_sweeps_note_says_how_the_chosen_metric_was_scored(tmp_path, tiny_translation):
    """Greedy decoding of the first valid_max_sentences sentences scores BLEU; the loss (and ppl) is of every pair
    validated: with data.filter_valid those the length filter keeps (the note said the whole validation set)."""
    from sanlab.experiments import analyze

    by_loss = _scored_run(tmp_path, "by-loss", tiny_translation(best_metric="loss"), RECORDS)
    note = analyze.sweep([by_loss], key="train.lr", out=tmp_path / "loss")["md"].read_text()
    assert "greedy" not in note and "(loss: the loss over every validation pair, those `data.filter_valid` keeps where set; no decoding)" in note
    note = analyze.sweep([by_loss], key="train.lr", out=tmp_path / "bleu", metric="bleu")["md"].read_text()
    assert "greedy decoding of the first `train.valid_max_sentences` sentences" in note


def test_the_analyze_help_gives_each_runs_best_metric_as_the_default(capsys):
    from sanlab.cli import main

    for name in ("sweep", "curves"):
        with pytest.raises(SystemExit):
            main(["analyze", name, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "train.best_metric" in text and "bleu / accuracy" not in text and "default: bleu" not in text, name


def test_perplexity_is_exact_enough_to_order_as_the_loss_does():
    """In float32, losses a few ulps apart tie in ppl (exp(2.0) and exp(2.0 + 2e-9)); overflow is inf."""
    from sanlab.tasks.translation import perplexity

    assert perplexity(2.0) < perplexity(2.0 + 2e-9) and perplexity(0.0) == 1.0
    assert perplexity(1000.0) == math.inf and math.isnan(perplexity(math.nan))


def test_average_best_and_its_stale_check_rank_by_a_lower_is_better_metric(tmp_path, tiny_translation, monkeypatch):
    """`average --best N` and `stale_average` rank the kept checkpoints as training did: by loss, the lowest."""
    from sanlab.runs import train_run
    from sanlab.runs.trained import average_run, stale_average

    _scripted(monkeypatch, [*LOSSES, 2.8, 1.0], [*BLEUS, 8.0, 0.5])
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=5, valid_every=1, keep_best=2, keep_last=1, best_metric="loss"), run,
              quiet=True)
    averaged = average_run(run, best=2)
    meta = json.loads((averaged / "meta.json").read_text())
    assert (meta["averaged"], meta["selection"]) == (["step-00000004", "step-00000002"], "best 2")  # 1.5, 2.0
    config = tiny_translation(max_steps=6, valid_every=1, keep_best=2, keep_last=1, best_metric="loss")
    train_run(config, run, quiet=True)  # step 6, loss 2.8: not among the 2 best
    assert stale_average(run, averaged, config) == ""
    config = tiny_translation(max_steps=7, valid_every=1, keep_best=2, keep_last=1, best_metric="loss")
    train_run(config, run, quiet=True)  # step 7, loss 1.0: the new best
    assert "the run's best 2 are now step-00000007, step-00000004" in stale_average(run, averaged, config)
