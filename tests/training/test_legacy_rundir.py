"""Run directories written before the run layout moved into one object (``tests/fixtures/rundir-v1``, made by
``tests/fixtures/make_rundir_v1.py`` with the code of that time) still resume and evaluate."""

from pathlib import Path

import pytest

from sanlab.config import load_config
from sanlab.runs import evaluate_run, train_run
from sanlab.training import rundir

# the fixture ``legacy``: a copy of tests/fixtures/rundir-v1 (tests/training/conftest.py)


@pytest.mark.parametrize("name, more", [("translation", ["train.max_steps=6"]), ("tagging", ["train.max_epochs=3"])])
def test_legacy_run_resumes_and_evaluates(legacy, name, more):
    run = Path(name)
    assert rundir.is_run(run)
    assert all(rundir.is_known(entry) for entry in rundir.entries(run)), rundir.entries(run)
    before = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    summary = train_run(load_config(run / "config.yaml", list(more)), run, quiet=True)
    assert summary["step"] > int(before[-1].split("-")[1])  # resumed, not restarted: trained on from there
    assert "resum" in (run / "train.log").read_text(encoding="utf-8").lower()
    results = evaluate_run(run, checkpoint="last")
    assert "test" in results
    record = results["test"]
    assert record["step"] == summary["step"]
    if name == "translation":
        assert (run / record["hypotheses"]).is_file()  # (named beside the record)
        assert 0 <= record["bleu"] <= 100
    else:
        assert 0 <= record["all"] <= 100
    assert (run / "eval-last.json").is_file() and (run / "eval-best.json").is_file()  # the old record is kept


@pytest.mark.parametrize("name", ["translation", "tagging"])
def test_legacy_run_evaluates_as_written(legacy, name):
    """Evaluating the committed checkpoint again gives the scores the old code recorded."""
    import json

    run = Path(name)
    old = json.loads((run / "eval-best.json").read_text(encoding="utf-8"))
    new = evaluate_run(run, checkpoint="best")
    key = "bleu" if name == "translation" else "all"
    assert {s: r[key] for s, r in new.items()} == {s: r[key] for s, r in old.items()}


def test_layout_keeps_the_names_runs_were_written_with():
    """``RunLayout`` is the one source of the names; they are the ones every earlier run directory holds."""
    from sanlab.training.layout import RunLayout

    assert RunLayout.known_names() == rundir.KNOWN_NAMES == {
        "config.yaml", "meta.json", "metrics.jsonl", "train.log", "tensorboard", "checkpoints", "averaged",
        "subword.model", "subword.vocab", "subword-src.model", "subword-src.vocab", "subword-tgt.model",
        "subword-tgt.vocab", "tagger-vocab.json", ".lock", "done.json", "compare-eval.json", "failed.json",
        "launch.log"}
    assert rundir.KNOWN_PATTERNS == ("eval-*.json", "hyp-*.txt", "tags-*.jsonl.gz", ".*.tmp", ".*.tmp.*", ".*.old")
    run = RunLayout("runs/x")
    assert run.hypotheses("checkpoints/step-00000004", "test") == Path("runs/x/hyp-step-00000004-test.txt")
    assert run.eval_record("best") == Path("runs/x/eval-best.json")
    assert run.tag_predictions("best", "dev") == Path("runs/x/tags-best-dev.jsonl.gz")
    assert run.subword_models(joint=False) == [Path("runs/x/subword-src.model"), Path("runs/x/subword-tgt.model")]
