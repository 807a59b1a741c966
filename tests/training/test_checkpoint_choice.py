"""Which checkpoint is "best": ties go to the newest (fairseq's checkpoint_best), and lower-is-better
metrics rank the other way."""

import json

import pytest

from sanlab.training.checkpoint import CheckpointManager


def _checkpoints(tmp_path, scores):
    for step, score in scores.items():
        d = tmp_path / "checkpoints" / f"step-{step:08d}"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"step": step, "epoch": 1, "score": score}))


def _steps(paths):
    return [int(p.name.removeprefix("step-")) for p in paths]


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_of_equal_scores_the_newest_checkpoint_is_best(tmp_path, higher_is_better):
    _checkpoints(tmp_path, {100: 0.0, 200: 0.0, 300: 0.0, 400: None})
    manager = CheckpointManager(tmp_path, keep_best=0, keep_last=0, higher_is_better=higher_is_better, writer=False)
    assert _steps(manager.best()) == [300, 200, 100]  # unscored checkpoints are never "best"


def test_scores_rank_before_steps_in_either_direction(tmp_path):
    _checkpoints(tmp_path, {100: 2.0, 200: 5.0, 300: 2.0, 400: 1.0})
    higher = CheckpointManager(tmp_path, keep_best=0, keep_last=0, higher_is_better=True, writer=False)
    lower = CheckpointManager(tmp_path, keep_best=0, keep_last=0, higher_is_better=False, writer=False)
    assert _steps(higher.best()) == [200, 300, 100, 400]
    assert _steps(lower.best(3)) == [400, 300, 100]
