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


def test_only_directories_named_as_sanlab_names_them_are_checkpoints(tmp_path):
    """A backup copy (step-00000200.bak), a file (step-list.txt), an average written there (step-avg) or a name
    sanlab never writes (step-300) is not a checkpoint: never averaged, loaded as `last` or resumed from."""
    import shutil

    from sanlab.errors import ConfigError

    _checkpoints(tmp_path, {100: 1.0, 200: 2.0})
    directory = tmp_path / "checkpoints"
    shutil.copytree(directory / "step-00000200", directory / "step-00000200.bak")
    (directory / "step-list.txt").write_text("my notes\n")
    (directory / "step-avg").mkdir()
    (directory / "step-avg" / "meta.json").write_text(json.dumps({"averaged": ["step-00000100"]}))
    (directory / "step-300").mkdir()
    (directory / "step-300" / "meta.json").write_text(json.dumps({"step": 300, "score": 9.0}))
    manager = CheckpointManager(tmp_path, keep_best=0, keep_last=0, higher_is_better=True, writer=False)
    assert _steps(manager.last(5)) == [100, 200] and _steps(manager.best()) == [200, 100]
    assert manager.latest().name == "step-00000200"
    (directory / "latest.json").write_text(json.dumps({"checkpoint": "step-avg"}))
    with pytest.raises(ConfigError, match=r"latest.json: expected \{\"checkpoint\": \"step-N\"\}, found"):
        manager.latest()


@pytest.mark.parametrize("key, value, said", [
    ("step", None, '"step" is missing'), ("step", "3", '"step" is "3", not the update number'),
    ("step", True, '"step" is true'), ("score", "0.5", '"score" is "0.5", not a number or null'),
    ("sha256", None, '"sha256" is null'), ("sha256", {"model.safetensors": 5}, '"sha256" is {"model.safetensors": 5}')])
def test_a_meta_json_of_the_wrong_shape_is_a_damaged_checkpoint_naming_it(tmp_path, key, value, said):
    """An edited meta.json (step gone, a score as text, checksums null) is named with what is wrong and what to
    do, as a damaged one is, instead of a KeyError or TypeError from sorting, resuming or averaging."""
    from sanlab.training.checkpoint import DamagedCheckpoint, verify

    _checkpoints(tmp_path, {100: 1.0, 200: 2.0})
    meta_path = tmp_path / "checkpoints" / "step-00000100" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta.pop(key) if value is None and key == "step" else meta.update({key: value})
    meta_path.write_text(json.dumps(meta))
    manager = CheckpointManager(tmp_path, keep_best=0, keep_last=0, higher_is_better=True, writer=False)
    for listing in (manager.all, manager.best, manager.resume_candidates):
        with pytest.raises(DamagedCheckpoint, match=f"{meta_path}: damaged: {said}.*move step-00000100 out of"):
            listing()
    if key == "sha256":  # also where a checkpoint's files are checked (an average's, say, which has no step)
        with pytest.raises(DamagedCheckpoint, match=f"{meta_path}: damaged: {said}"):
            verify(meta_path.with_name("model.safetensors"))
