"""Diagnostics: scalars a module reports about its own parameters (learnable temperatures), keyed by path."""

import math

import pytest
import torch

from sanlab.config import TaggerConfig
from sanlab.models.builders import build_tagger
from sanlab.training.diagnostics import collect_diagnostics


def _tagger(parts):
    config = TaggerConfig(word_dim=8, char_dim=4, char_filters=4, char_width=3, char_layers=1, position="add",
                          max_len=10, encoder=dict(layers=2, ffn_dim=0, attention=dict(heads=2, parts=parts)))
    return build_tagger(config, vocab_size=30, num_chars=10, num_tags=5)


def test_temperature_reports_log_gamma_per_layer_and_projection():
    model = _tagger([{"type": "temperature"}])
    temps = [m for m in model.modules() if hasattr(m, "gamma_q")]
    with torch.no_grad():
        temps[1].gamma_q.copy_(torch.tensor([2.0, 0.25]))   # log: 0.693, -1.386 -> extreme is the second head
        temps[1].gamma_v.copy_(torch.tensor([-3.0, 1.0]))   # a negative scale counts by its magnitude
    found = collect_diagnostics(model)
    keys = sorted(found)
    assert len(keys) == 2 * 6 and all("/log_gamma_" in k for k in keys)
    first, second = sorted({k.split("/")[0] for k in keys})
    assert found[f"{first}/log_gamma_q_mean"] == 0.0 and found[f"{first}/log_gamma_k_extreme"] == 0.0
    assert found[f"{second}/log_gamma_q_mean"] == pytest.approx((math.log(2) + math.log(0.25)) / 2)
    assert found[f"{second}/log_gamma_q_extreme"] == pytest.approx(math.log(0.25))
    assert found[f"{second}/log_gamma_v_extreme"] == pytest.approx(math.log(3))


def test_a_model_without_reporting_parts_reports_nothing():
    assert collect_diagnostics(_tagger([])) == {}


def test_training_logs_the_diagnostics_at_every_validation(tmp_path, tiny_translation):
    import yaml

    from sanlab.config import dump_config, validate
    from sanlab.runs import train_run
    from sanlab.training.logging import read_metrics

    raw = yaml.safe_load(dump_config(tiny_translation(max_steps=6, valid_every=3)))
    raw["model"]["encoder"]["attention"]["parts"] = [{"type": "temperature"}]
    run = tmp_path / "run"
    train_run(validate(raw, source="test"), run, quiet=True)
    records = read_metrics(run)
    valid = [r["step"] for r in records if r["split"] == "valid"]
    diagnostics = [r for r in records if r["split"] == "diagnostics"]
    assert [r["step"] for r in diagnostics] == valid == [3, 6]
    keys = sorted(k for k in diagnostics[-1] if "/log_gamma_" in k)
    assert len(keys) == 6 and all(k.startswith("encoder.") for k in keys)
    assert any(diagnostics[-1][k] != 0.0 for k in keys)  # trained off their initial 1
