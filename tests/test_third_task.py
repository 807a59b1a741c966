"""A third task beside translation and tagging, in a researcher's own package, registered through the entry point
group ``sanlab.tasks`` (docs/tasks.md, "Adding a task"): trained, resumed, evaluated and compared on a tiny grid
through the same commands, without a line of sanlab changed.

The task copies letters (each token's label is the token): a config class (torch-free), a ``Task`` with its
trainer, evaluation, per-sentence evidence, significance test and synthetic corpus. The package is written to a
temporary folder with a ``*.dist-info`` (as test_plugins.py does); the commands run in fresh interpreters.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # (fresh interpreters per command: make test runs it, the inner loop does not)

PLUGIN = {
    "my_tasks/__init__.py": "",
    "my_tasks/config.py": '''
        from typing import Literal

        from sanlab.config import Strict, TaskConfig, TrainConfig


        class CopyData(Strict):
            train: str
            dev: str
            test: str | None = None


        class CopyModel(Strict):
            dim: int = 16


        class CopyConfig(TaskConfig):
            """Copy letters: each token's label is the token."""

            implementation = "my_tasks.task:Copy"  # the Task of this config
            task: Literal["copy"]
            data: CopyData
            train: TrainConfig = TrainConfig()
            model: CopyModel = CopyModel()
        ''',
    "my_tasks/task.py": '''
        import gzip
        import hashlib
        import json
        import random
        from pathlib import Path

        import torch
        import torch.nn.functional as F
        from torch import nn

        from sanlab.errors import ConfigError
        from sanlab.tasks.base import Task
        from sanlab.training.layout import RunLayout

        LETTERS = "abcdefghijklmnopqrstuvwxyz"


        def read(path):
            return [line.split() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


        def encode(sentences):
            width = max(len(s) for s in sentences)
            ids = torch.zeros(len(sentences), width, dtype=torch.long)
            for i, s in enumerate(sentences):
                ids[i, :len(s)] = torch.tensor([1 + LETTERS.index(w) for w in s])
            return ids, ids.clone()  # the label of a token is the token


        def build(config):
            return nn.Sequential(nn.Embedding(27, config.model.dim), nn.Linear(config.model.dim, 27))


        @torch.no_grad()
        def correct(model, sentences):
            model.eval()
            ids, labels = encode(sentences)
            hits = (model(ids).argmax(-1) == labels)
            return [hits[i, :len(s)].tolist() for i, s in enumerate(sentences)]


        def accuracy(flags):
            tokens = sum(len(f) for f in flags)
            return 100.0 * sum(map(sum, flags)) / max(tokens, 1)


        class CopyTrainer:
            metric, higher_is_better = "accuracy", True

            def __init__(self, config, run_dir, log):
                self.config, self.train, self.dev = config, read(config.data.train), read(config.data.dev)
                self.model = build(config)
                log.info(f"copy: {len(self.train)} training sentences")

            def epoch_batches(self, epoch):
                order = list(range(len(self.train)))
                random.Random(self.config.train.seed * 1_000_003 + epoch).shuffle(order)
                size = self.config.train.batch_size
                return [encode([self.train[i] for i in order[k:k + size]]) for k in range(0, len(order), size)]

            def batch_tokens(self, batch):
                return int((batch[0] != 0).sum())

            def loss(self, batch, *, model=None):
                ids, labels = batch
                logits = (model or self.model)(ids)
                return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=0, reduction="sum")

            def validate(self):
                flags = correct(self.model, self.dev)
                self.model.train()
                return {"accuracy": accuracy(flags)}


        class Copy(Task):
            name = "copy"
            metric, higher_is_better, eval_metric = "accuracy", True, "accuracy"
            metrics = (("Acc.", "accuracy"),)
            significance_test = "paired bootstrap over sentences of token accuracy"

            def trainer(self, config, run_dir, log):
                return CopyTrainer(config, run_dir, log)

            def check_buildable(self, config):
                build(config)

            def training_files(self, config):
                return [config.data.train, config.data.dev]

            def data_files(self, config):
                d = config.data
                return [(f"data.{k}", getattr(d, k)) for k in ("train", "dev", "test") if getattr(d, k)]

            def load_model(self, config, run_dir):
                return build(config), None

            def splits(self, config):
                return ["dev", *(["test"] if config.data.test else [])]

            def default_split(self, config):
                return self.splits(config)[-1]

            def split_files(self, config, split):
                return [Path(getattr(config.data, split))]

            def evaluate(self, model, assets, config, *, run_dir, checkpoint, splits, decode_overrides):
                if decode_overrides:
                    raise ConfigError("a copy run has no decode settings")
                results = {}
                for split in splits or self.splits(config):
                    flags = correct(model, read(self.split_files(config, split)[0]))
                    results[split] = {"accuracy": accuracy(flags), "sentences": len(flags)}
                return results

            def evaluate_cell(self, cell):
                config, model, _ = cell.load()
                sentences = read(self.split_files(config, cell.split)[0])
                flags = correct(model, sentences)
                path = RunLayout(cell.run_dir).tag_predictions(cell.checkpoint, cell.split)
                with gzip.open(path, "wt", encoding="utf-8") as f:
                    for words, hits in zip(sentences, flags):
                        f.write(json.dumps({"words": words, "correct": hits}) + "\\n")
                return {"accuracy": accuracy(flags)}, path.name, {"signature": None}

            def read_evidence(self, path):
                with gzip.open(path, "rt", encoding="utf-8") as f:
                    rows = [json.loads(line) for line in f]
                digest = hashlib.sha256(json.dumps([r["words"] for r in rows]).encode()).hexdigest()
                return [r["correct"] for r in rows], digest

            def paired_test(self, baseline, system, references, *, n_samples, seed):
                from sanlab.evaluation.significance import paired_bootstrap_accuracy

                return paired_bootstrap_accuracy(baseline, system, n_samples=n_samples, seed=seed)

            def seeds_test(self, baseline, system, references, *, n_samples, seed):
                from sanlab.evaluation.seed_significance import seed_bootstrap_accuracy

                return seed_bootstrap_accuracy(baseline, system, n_samples=n_samples, seed=seed)

            def write_synthetic(self, data_dir, *, seed, sizes):
                rng = random.Random(seed)
                Path(data_dir).mkdir(parents=True, exist_ok=True)
                for split, n in sizes.items():
                    lines = [" ".join(rng.choice(LETTERS[:8]) for _ in range(rng.randint(2, 6))) for _ in range(n)]
                    (Path(data_dir) / f"{split}.txt").write_text("".join(line + "\\n" for line in lines))

            def synthetic_data(self, data_dir):
                return {"data": {s: str(Path(data_dir) / f"{s}.txt") for s in self.synthetic_splits}}
        ''',
    "my_tasks-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: my-tasks\nVersion: 0.1\n",
    "my_tasks-0.1.dist-info/entry_points.txt": "[sanlab.tasks]\ncopy = my_tasks.config:CopyConfig\n",
}

CONFIG = """
task: copy
data: {train: data/train.txt, dev: data/dev.txt, test: data/test.txt}
model: {dim: 8}
train: {seed: 1, lr: 0.05, schedule: constant, warmup_steps: 0, batch_size: 8, max_steps: 2, valid_every: 2,
        keep_best: 1, keep_last: 1, progress: false, threads: 1, label_smoothing: 0.0}
"""

GRID = """
base: copy.yaml
title: A copy task in a grid
seeds: [1, 2]
variants:
  - {name: narrow}
  - {name: wide, overrides: ["model.dim=32"]}
synthetic: {task: copy, seed: 3, sizes: {train: 40, dev: 10, test: 12}}
runs_dir: runs/grid
set: [train.max_steps=4]
"""


def write_plugin(root: Path) -> Path:
    site = root / "site"
    for name, text in PLUGIN.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return site


@pytest.fixture
def project(tmp_path):
    """A working directory with the plug-in on the path, its data, a config and a grid; ``sanlab`` runs a command."""
    site = write_plugin(tmp_path)
    (tmp_path / "data").mkdir()
    for split, n in (("train", 40), ("dev", 10), ("test", 12)):
        lines = [" ".join("abcdefgh"[(i * 7 + k * 3) % 8] for k in range(2 + i % 4)) for i in range(n)]
        (tmp_path / "data" / f"{split}.txt").write_text("".join(line + "\n" for line in lines))
    (tmp_path / "copy.yaml").write_text(CONFIG)
    (tmp_path / "grid.yaml").write_text(GRID)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}

    def sanlab(*argv: str) -> str:
        result = subprocess.run([sys.executable, "-m", "sanlab", *argv], cwd=tmp_path, env=env, capture_output=True,
                                text=True, timeout=600)
        assert result.returncode == 0, f"sanlab {' '.join(argv)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout + result.stderr

    return tmp_path, sanlab


def test_a_plugin_task_trains_resumes_evaluates_and_compares(project):
    root, sanlab = project
    sanlab("train", "copy.yaml", "--run", "runs/copy", "--quiet")
    run = root / "runs" / "copy"
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["checkpoint"] == "step-00000002"
    sanlab("train", "copy.yaml", "--run", "runs/copy", "--quiet", "--set", "train.max_steps=4")  # resumes
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["checkpoint"] == "step-00000004"
    assert "resum" in (run / "train.log").read_text().lower()
    sanlab("evaluate", "--run", "runs/copy")
    record = json.loads((run / "eval-best.json").read_text())
    assert set(record) == {"dev", "test"} and 0 <= record["test"]["accuracy"] <= 100
    assert record["test"]["step"] in (2, 4)

    out = sanlab("compare", "grid.yaml", "--quiet")
    table = (root / "runs" / "grid" / "table.md").read_text()
    assert "Acc." in table and "narrow" in table and "wide" in table
    assert "paired bootstrap over sentences of token accuracy" in table
    cells = sorted(p.parent.relative_to(root / "runs" / "grid") for p in (root / "runs" / "grid").glob("*/*/compare-eval.json"))
    assert [str(c) for c in cells] == ["narrow/seed-1", "narrow/seed-2", "wide/seed-1", "wide/seed-2"], out
    again = sanlab("compare", "grid.yaml", "--table-only")  # the committed-table path: reads, trains nothing
    assert "cells done: 4 of 4" in again and "| wide | 2/2 |" in again
