"""One short training step on each real corpus (skipped when ../shared/data is absent)."""

import json
import math
from pathlib import Path

import pytest

from sanlab.config import load_config
from sanlab.runs import train_run

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _data_overrides(shared_file, recipe):
    if recipe.startswith("multi30k"):
        m = {name: shared_file(f"multi30k/{name}.gz") for name in ("train.en", "train.de", "val.en", "val.de")}
        return [f"data.train={{src: {m['train.en']}, tgt: {m['train.de']}}}",
                f"data.valid={{src: {m['val.en']}, tgt: {m['val.de']}}}", "data.test={}",
                "data.subword.vocab_size=2000", "train.valid_max_sentences=8", "train.max_tokens=1024"]
    ud = {split: shared_file(f"ud/UD_English-EWT/en_ewt-ud-{split}.conllu.gz") for split in ("train", "dev")}
    return [f"data.train={ud['train']}", f"data.dev={ud['dev']}", "data.test=null"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["multi30k-en-de-transformer.yaml", "ud-ewt-tagger.yaml"])
def test_one_training_step_on_real_data(recipe, shared_file, tmp_path):
    overrides = _data_overrides(shared_file, recipe) + [
        "train.max_steps=2", "train.valid_every=2", "train.progress=false", "train.max_epochs=1",
        "train.log_every=1"]
    config = load_config(CONFIGS / recipe, overrides)
    summary = train_run(config, tmp_path / "run", quiet=True)
    assert summary["step"] == 2
    assert summary["best"] is not None and math.isfinite(summary["best"])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
