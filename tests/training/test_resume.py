"""Interrupting and resuming a run gives exactly the parameters of an uninterrupted run."""

import pytest
import torch
from safetensors.torch import load_file

from sanlab.errors import ConfigError, TrainingError
from sanlab.runs import train_run


def _final_weights(run):
    latest = sorted((run / "checkpoints").glob("step-*"))[-1]
    return load_file(str(latest / "model.safetensors"))


def test_resumed_run_equals_uninterrupted(tmp_path, tiny_translation):
    straight = tmp_path / "straight"
    train_run(tiny_translation(max_steps=7, accum_steps=2), straight, quiet=True)
    resumed = tmp_path / "resumed"
    train_run(tiny_translation(max_steps=3, accum_steps=2), resumed, quiet=True)
    summary = train_run(tiny_translation(max_steps=7, accum_steps=2), resumed, quiet=True)  # resumes at step 3
    assert summary["step"] == 7
    a, b = _final_weights(straight), _final_weights(resumed)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_resume_refuses_a_different_model(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=3), run, quiet=True)
    with pytest.raises(ConfigError, match="train.lr"):
        train_run(tiny_translation(max_steps=3, lr=0.5), run, quiet=True)


def test_nan_loss_stops_without_saving(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=3), run, quiet=True)
    saved = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    with pytest.raises(TrainingError, match="loss is nan at update 4"):
        _poison_and_train(run, tiny_translation)
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == saved


def _poison_and_train(run, make):
    """Resume the run after setting one weight to NaN: the next loss is NaN."""
    from safetensors.torch import save_file

    latest = sorted((run / "checkpoints").glob("step-*"))[-1]
    weights = load_file(str(latest / "model.safetensors"))
    name = next(k for k in weights if "generator" in k or "embed" in k)
    weights[name][0, 0] = float("nan")
    save_file(weights, str(latest / "model.safetensors"))
    train_run(make(max_steps=6), run, quiet=True)
