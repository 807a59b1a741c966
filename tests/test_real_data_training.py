"""One short training step on each real corpus (skipped when ../shared/data is absent)."""

import math
from pathlib import Path

import pytest

from sanlab.config import load_config
from sanlab.runs import train_run

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _data_overrides(shared_data, recipe):
    if recipe.startswith("multi30k"):
        m = shared_data / "multi30k"
        return [f"data.train={{src: {m}/train.en.gz, tgt: {m}/train.de.gz}}",
                f"data.valid={{src: {m}/val.en.gz, tgt: {m}/val.de.gz}}", "data.test={}",
                "data.subword.vocab_size=2000", "train.valid_max_sentences=8", "train.max_tokens=1024"]
    ud = shared_data / "ud" / "UD_English-EWT"
    return [f"data.train={ud}/en_ewt-ud-train.conllu.gz", f"data.dev={ud}/en_ewt-ud-dev.conllu.gz",
            "data.test=null"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["multi30k-en-de-transformer.yaml", "ud-ewt-tagger.yaml"])
def test_one_training_step_on_real_data(recipe, shared_data, tmp_path):
    overrides = _data_overrides(shared_data, recipe) + [
        "train.max_steps=2", "train.valid_every=2", "train.progress=false", "train.max_epochs=1"]
    config = load_config(CONFIGS / recipe, overrides)
    summary = train_run(config, tmp_path / "run", quiet=True)
    assert summary["step"] == 2
    assert summary["best"] is not None and math.isfinite(summary["best"])
