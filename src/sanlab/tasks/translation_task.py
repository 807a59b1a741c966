"""Translation as a ``Task``: what runs, evaluation and comparison grids ask of a translation config."""

from __future__ import annotations

from pathlib import Path

from sanlab.tasks.base import CellRun, Task


class Translation(Task):
    name = "translation"
    metric, higher_is_better, eval_metric = "bleu", True, "bleu"
    metrics = (("BLEU", "bleu"), ("chrF", "chrf"))
    significance_test = "sacreBLEU paired bootstrap (paired-bs)"
    commands = frozenset({"translate", "prepare", "bleu-analysis", "params"})
    own_command = "translate"
    synthetic_splits = ("train", "valid", "test")
    decodes = True
    precisions = ("fp32", "bf16")

    # ----------------------------------------------------------------- training
    def trainer(self, config, run_dir: Path, log, *, main: bool = True):
        from sanlab.tasks.translation import TranslationTask

        return TranslationTask(config, run_dir, log, main=main)

    def shared_files(self, config, run_dir: Path) -> list[Path]:
        from sanlab.training.layout import RunLayout

        return RunLayout(run_dir).subword_models(joint=config.data.subword.joint)

    def check_buildable(self, config) -> None:
        from sanlab.models.builders import build_seq2seq

        build_seq2seq(config.model, vocab_size=16, pad_id=0)

    def training_files(self, config) -> list[str]:
        d = config.data
        return [*(f for c in d.train_corpora for f in (c.src, c.tgt)), d.valid.src, d.valid.tgt]

    def data_files(self, config) -> list[tuple[str, str]]:
        d = config.data
        corpora = d.train_corpora  # data.train: one pair, or weighted corpora
        train = [("train", c) for c in corpora] if len(corpora) == 1 else [(f"train[{k}]", c) for k, c in
                                                                            enumerate(corpora)]
        pairs = [*train, ("valid", d.valid), *((f"test.{k}", v) for k, v in d.test.items())]
        return [(f"data.{name}.{side}", getattr(pair, side)) for name, pair in pairs for side in ("src", "tgt")]

    # ----------------------------------------------------------------- trained runs
    def load_model(self, config, run_dir: Path):
        from sanlab.tasks.translation import load_translation_model

        return load_translation_model(config, run_dir)

    def vocabulary(self, assets) -> str:
        return assets.vocabulary()

    def decode_settings(self, config, decode_overrides: dict | None) -> dict:
        return self._decoding(config, decode_overrides).model_dump()

    def evaluate(self, model, assets, config, *, run_dir: Path, checkpoint: str, splits: list[str] | None,
                 decode_overrides: dict | None, precision=None) -> dict:
        from sanlab.tasks.translation import evaluate_translation

        return evaluate_translation(model, assets, config, splits=splits, decode=self._decoding(config, decode_overrides),
                                    out_dir=Path(run_dir), tag=checkpoint, precision=precision)

    @staticmethod
    def _decoding(config, decode_overrides: dict | None):
        # one hypothesis per sentence is scored, so a run's n_best (for `translate`) must not limit --beam
        return config.decode.updated(**{"n_best": 1, **(decode_overrides or {})})

    def summary(self, record: dict) -> str:
        return record["formatted"]

    def splits(self, config) -> list[str]:
        return ["valid", *config.data.test]

    def default_split(self, config) -> str:
        return next(iter(config.data.test), "valid")

    def split_files(self, config, split: str) -> list[Path]:
        pair = config.data.valid if split == "valid" else config.data.test[split]
        return [Path(pair.src), Path(pair.tgt)]

    # ----------------------------------------------------------------- comparison grids
    def eval_key(self, config) -> dict:
        # batch_sentences stays: which sentences share a batch changes Block attention's `block_len: auto` (the
        # batch's longest sentence) and, in floating point, any padded encoder's outputs
        # (tests/experiments/test_eval_key.py)
        # keys added since at their old value are left out: cells scored before them stay scored
        return {"decode": type(config.decode).as_recorded(config.decode.model_dump(mode="json"))}

    def evaluate_cell(self, cell: CellRun) -> tuple[dict, str, dict]:
        # the grid's decode settings, not the ones saved when the cell was trained
        result = cell.evaluate(splits=[cell.split], decode_overrides=cell.config.decode.model_dump())[cell.split]
        scores = {"bleu": result["bleu"], "chrf": result["chrf"]}
        return scores, Path(result["hypotheses"]).name, {"signature": result["bleu_signature"],
                                                         "chrf_signature": result["chrf_signature"]}

    def read_evidence(self, path: Path) -> tuple[list, str | None]:
        from sanlab.tasks.translation import read_hypotheses

        return read_hypotheses(path), None

    def references(self, config, split: str) -> list[str] | None:
        from sanlab.data.parallel import read_parallel

        src, tgt = self.split_files(config, split)
        return [t for _, t in read_parallel(src, tgt, keep_empty=True)]  # every line, as evaluation scores

    def reference_file(self, config, split: str) -> str | None:
        return str(self.split_files(config, split)[1])

    def paired_test(self, baseline, system, references, *, n_samples: int, seed: int):
        from sanlab.evaluation.significance import paired_bootstrap_bleu

        return paired_bootstrap_bleu(baseline, system, references, n_samples=n_samples, seed=seed)

    def seeds_test(self, baseline, system, references, *, n_samples: int, seed: int):
        from sanlab.evaluation.seed_significance import seed_bootstrap_bleu

        return seed_bootstrap_bleu(baseline, system, references, n_samples=n_samples, seed=seed)

    # ----------------------------------------------------------------- synthetic data, analyses
    def write_synthetic(self, data_dir: Path, *, seed: int, sizes: dict[str, int]) -> None:
        from sanlab.data.synthetic import write_translation_corpus

        write_translation_corpus(data_dir, seed=seed, sizes=sizes)

    def synthetic_data(self, data_dir: Path) -> dict:
        files = {s: {"src": str(data_dir / f"{s}.src"), "tgt": str(data_dir / f"{s}.tgt")}
                 for s in ("train", "valid", "test")}
        return {"data": {"train": files["train"], "valid": files["valid"], "test": {"test": files["test"]}}}

    def attention_trace(self, model, assets, config, *, sentence: str, side: str, layer: int, target: str | None):
        from sanlab.tasks.traces import translation_trace

        return translation_trace(model, assets, config, sentence=sentence, side=side, layer=layer, target=target)
