"""Every variant recipe trains briefly on the synthetic corpora: finite losses that go down.

Each recipe in ``configs/`` (``multi30k-en-de-*.yaml``, ``ud-ewt-*.yaml``) keeps its variant
settings, but its data is pointed at the project's synthetic corpora and its widths are shrunk,
so the check runs in seconds per variant. Used by ``bench/variant_smoke.py`` (long runs, results
committed) and by a slow test (short runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from sanlab.config import load_config
from sanlab.data.synthetic import write_tagging_corpus, write_translation_corpus
from sanlab.runs import train_run
from sanlab.training.logging import read_metrics

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@dataclass(frozen=True)
class SmokeResult:
    recipe: str
    steps: int
    first_loss: float      # mean training loss of the first tenth of the logged updates
    last_loss: float       # ... of the last tenth
    finite: bool
    seconds: float

    @property
    def improved(self) -> bool:
        return self.finite and self.last_loss < self.first_loss


def _translation_overrides(data: Path, steps: int) -> list[str]:
    files = {s: (data / f"{s}.src", data / f"{s}.tgt") for s in ("train", "valid", "test")}
    return [f"data.train={{src: {files['train'][0]}, tgt: {files['train'][1]}}}",
            f"data.valid={{src: {files['valid'][0]}, tgt: {files['valid'][1]}}}", "data.test={}",
            "data.subword.vocab_size=300", "model.dim=64", "model.dropout=0.1",
            "model.encoder.ffn_dim=128", "model.decoder.ffn_dim=128", "model.encoder.attention.heads=4",
            "model.decoder.attention.heads=4", "train.max_tokens=1500", "train.warmup_steps=50",
            f"train.max_steps={steps}", f"train.valid_every={steps}", "train.valid_max_sentences=20",
            "train.log_every=1", "train.progress=false", "train.keep_best=1", "train.keep_last=1"]


def _tagging_overrides(data: Path, steps: int) -> list[str]:
    return [f"data.train={data / 'train.conllu'}", f"data.dev={data / 'dev.conllu'}", "data.test=null",
            "model.word_dim=32", "model.char_dim=16", "model.char_filters=16", "model.char_layers=1",
            "model.encoder.layers=2", "train.batch_size=16", f"train.max_steps={steps}", "train.max_epochs=1000",
            "train.log_every=1", "train.progress=false", "train.patience=0"]


def recipes() -> list[Path]:
    return sorted(CONFIGS.glob("multi30k-en-de-*.yaml")) + sorted(CONFIGS.glob("ud-ewt-*.yaml"))


def smoke_train(recipe: Path, *, work: Path, steps: int) -> SmokeResult:
    """Train ``recipe`` on synthetic data for ``steps`` updates; summarise the loss curve."""
    translation = recipe.name.startswith("multi30k")
    data = work / ("data-mt" if translation else "data-tag")
    if not data.exists():
        (write_translation_corpus(data, seed=1, sizes={"train": 3000, "valid": 50, "test": 50}) if translation
         else write_tagging_corpus(data, seed=1, sizes={"train": 800, "dev": 50, "test": 50}))
    overrides = (_translation_overrides if translation else _tagging_overrides)(data, steps)
    run = work / recipe.stem
    summary = train_run(load_config(recipe, overrides), run, overwrite=True, quiet=True)
    losses = [r["loss"] for r in read_metrics(run) if r["split"] == "train"]
    tenth = max(1, len(losses) // 10)
    first, last = sum(losses[:tenth]) / tenth, sum(losses[-tenth:]) / tenth
    return SmokeResult(recipe.name, summary["step"], first, last, all(map(math.isfinite, losses)),
                       summary["seconds"])
