"""Tagging as a ``Task``: what runs, evaluation and comparison grids ask of a tagging config."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from sanlab.errors import ConfigError
from sanlab.tasks.base import CellRun, Task

TAGGING_COLUMNS = (
    "Tagging columns (docs/training.md, \"Tagging accuracy\"): All, token accuracy over every word of the split; "
    "OOV, over words that do not occur in the training sentences (whatever the vocabulary holds); Ambig., over "
    "words seen in training with more than one tag. OOV, Ambig. and the rest (words seen with one training tag) "
    "partition All, so All is their token-weighted mean (group sizes under each table). OOV in voc. (only where "
    "the vocabulary is counted on dev/test too, data.vocab_from_all_splits): the OOV words that nevertheless "
    "have a vocabulary row, one that no training sentence trained; a subset of OOV.")
GROUP_COUNTS = ("n_all", "n_oov", "n_oov_in_vocab", "n_ambiguous", "n_unambiguous")
# The word groups of tagging accuracy (OOV, ambiguous, ... from the training data: evaluation.tagging), part of
# a tagging cell's evaluation key: a cell scored with the older definitions (OOV = outside the model's vocabulary)
# is scored again; ``sanlab compare GRID --rescore`` does it from its predictions file, without the model.
TAGGING_GROUPS = "training-data groups (2026-11-25)"


class Tagging(Task):
    name = "tagging"
    metric, higher_is_better, eval_metric = "accuracy", True, "all"
    # Tagging's groups are those of evaluation.tagging; "OOV in voc." (OOV words the vocabulary nevertheless
    # holds) is a column only where some cell has such a word
    metrics = (("All", "all"), ("OOV", "oov"), ("OOV in voc.", "oov_in_vocab"), ("Ambig.", "ambiguous"))
    optional_metrics = ("oov_in_vocab",)
    significance_test = "paired bootstrap over sentences of All accuracy"
    legend = (TAGGING_COLUMNS,)
    commands = frozenset({"tag", "rescore"})
    own_command = "tag"
    precisions = ("fp32", "bf16")

    # ----------------------------------------------------------------- training
    def trainer(self, config, run_dir: Path, log, *, main: bool = True):
        from sanlab.tasks.tagging import TaggingTask

        return TaggingTask(config, run_dir, log, main=main)

    def shared_files(self, config, run_dir: Path) -> list[Path]:
        from sanlab.training.layout import RunLayout

        return [RunLayout(run_dir).tagger_vocab]

    def check_buildable(self, config) -> None:
        from sanlab.models.builders import build_tagger

        build_tagger(config.model, vocab_size=16, num_chars=16, num_tags=4)

    def training_files(self, config) -> list[str]:
        d = config.data
        return [d.train, d.dev] + ([d.test] if d.test and d.vocab_from_all_splits else [])

    def data_files(self, config) -> list[tuple[str, str]]:
        d = config.data
        return [(f"data.{k}", getattr(d, k)) for k in ("train", "dev", "test") if getattr(d, k)]

    # ----------------------------------------------------------------- trained runs
    def load_model(self, config, run_dir: Path):
        from sanlab.tasks.tagging import load_tagging_model

        return load_tagging_model(config, run_dir)

    def vocabulary(self, assets) -> str:
        return assets.digest()

    def evaluate(self, model, assets, config, *, run_dir: Path, checkpoint: str, splits: list[str] | None,
                 decode_overrides: dict | None, precision=None) -> dict:
        from sanlab.tasks.tagging import evaluate_tagging_splits

        if decode_overrides:
            raise ConfigError(f"{run_dir} is a tagging run: decode settings ({', '.join(decode_overrides)}) do not "
                              "apply")
        return evaluate_tagging_splits(model, assets, config, splits=splits, precision=precision)

    def scored_against(self, config) -> list[str]:
        # the word groups (OOV, ambiguous, one training tag) are counted against the training file as it is now
        # (the vocabulary is the run's own file)
        return [config.data.train]

    def summary(self, record: dict) -> str:
        pct = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
        r = record  # groups of docs/training.md ("Tagging accuracy"): OOV + ambiguous + one tag = all
        return (f"accuracy all {pct(r['all'])}  OOV {pct(r['oov'])} (in vocabulary {pct(r['oov_in_vocab'])})  "
                f"ambiguous {pct(r['ambiguous'])}  one training tag {pct(r['unambiguous'])}\n"
                f"tokens {r['n_all']} = OOV {r['n_oov']} (in vocabulary {r['n_oov_in_vocab']}) + ambiguous "
                f"{r['n_ambiguous']} + one training tag {r['n_unambiguous']}\n{r['report']}")

    def splits(self, config) -> list[str]:
        return ["dev", *(["test"] if config.data.test else [])]

    def default_split(self, config) -> str:
        return "test" if config.data.test else "dev"

    def split_files(self, config, split: str) -> list[Path]:
        return [Path(config.data.test if split == "test" else config.data.dev)]

    # ----------------------------------------------------------------- comparison grids
    def eval_key(self, config) -> dict:
        return {"word_groups": TAGGING_GROUPS}

    def evaluate_cell(self, cell: CellRun) -> tuple[dict, str, dict]:
        """Accuracy over all tokens and each word group on the split; writes words, gold and predicted tags per
        sentence. Sentences longer than the model's t are tagged chunk by chunk and joined back, so the
        bootstrap resamples whole sentences (as ``runs.tag_file`` tags them)."""
        from sanlab.data.conllu_io import read_conllu
        from sanlab.evaluation.tagging import tagging_accuracy
        from sanlab.files import replacing
        from sanlab.tasks.tagging import tag_sentences, training_word_tags
        from sanlab.training.layout import RunLayout

        config, model, vocab = cell.load()
        d = config.data
        sents = read_conllu(self.split_files(config, cell.split)[0], column=d.column)
        pred = tag_sentences(model, vocab, sents, max_len=config.model.max_len, max_chars=config.model.max_word_chars)
        scores = tagging_accuracy(gold=[list(s.tags) for s in sents], pred=pred, words=[list(s.words) for s in sents],
                                  in_vocab=vocab.in_vocab, train_word_tags=training_word_tags(config))
        path = RunLayout(cell.run_dir).tag_predictions(cell.checkpoint, cell.split)
        with replacing(path, compress=True) as f:  # the committed evidence is never half written
            for s, p in zip(sents, pred):
                f.write(json.dumps({"words": list(s.words), "gold": list(s.tags), "pred": p}, ensure_ascii=False)
                        + "\n")
        return scores.record(), path.name, {"signature": None}

    def read_evidence(self, path: Path) -> tuple[list, str | None]:
        """Per-token correctness, and a digest of the words and gold tags, so that two cells scored on different
        test files are never paired."""
        words, gold, pred = read_tagged(path)
        digest = hashlib.sha256(json.dumps(list(zip(words, gold)), ensure_ascii=False).encode()).hexdigest()
        return [[g == p for g, p in zip(gs, ps)] for gs, ps in zip(gold, pred)], digest

    def paired_test(self, baseline, system, references, *, n_samples: int, seed: int):
        from sanlab.evaluation.significance import paired_bootstrap_accuracy

        return paired_bootstrap_accuracy(baseline, system, n_samples=n_samples, seed=seed)

    def seeds_test(self, baseline, system, references, *, n_samples: int, seed: int):
        from sanlab.evaluation.seed_significance import seed_bootstrap_accuracy

        return seed_bootstrap_accuracy(baseline, system, n_samples=n_samples, seed=seed)

    def table_notes(self, results: dict, *, split: str | None) -> str | None:
        return word_group_sizes(results, split=split)

    # ----------------------------------------------------------------- synthetic data, analyses
    def write_synthetic(self, data_dir: Path, *, seed: int, sizes: dict[str, int]) -> None:
        from sanlab.data.synthetic import write_tagging_corpus

        write_tagging_corpus(data_dir, seed=seed, sizes=sizes)

    def synthetic_data(self, data_dir: Path) -> dict:
        return {"data": {s: str(data_dir / f"{s}.conllu") for s in ("train", "dev", "test")}}

    def attention_trace(self, model, assets, config, *, sentence: str, side: str, layer: int, target: str | None):
        from sanlab.tasks.traces import tagging_trace

        if side != "encoder":
            raise ConfigError(f"a tagging run has only an encoder; got side {side!r}")
        return tagging_trace(model, assets, config, sentence=sentence, layer=layer)


def read_tagged(path: Path) -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
    """Words, gold and predicted tags per sentence of a ``tags-*.jsonl.gz`` predictions file."""
    words, gold, pred = [], [], []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                w, g, p = row["words"], row["gold"], row["pred"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ConfigError(f"{path}, line {number}: not a tagged sentence ({err})") from None
            words.append(w), gold.append(g), pred.append(p)
    return words, gold, pred


def word_group_sizes(results: dict, *, split: str | None) -> str | None:
    """The sentence under a tagging table saying how the split's tokens fall into the word groups, so a
    reader can decompose All (OOV + Ambig. + one training tag = All). None before any cell is scored."""
    # (by repr: a record of the old definitions holds None where a newer one has a count)
    counts = sorted({tuple(r.scores.get(k) for k in GROUP_COUNTS) for r in results.values() if r.scores}, key=repr)
    if not counts:
        return None
    if len(counts) > 1 or None in counts[0]:  # other vocabularies per row, or records of the old definitions
        return f"Word groups ({split} tokens): the cells count them differently: {counts}."

    def share(k: int) -> str:
        return f"{k:,} ({100 * k / n:.1f}%)" if n else f"{k:,}"

    n, oov, in_vocab, ambiguous, one = counts[0]
    text = (f"Word groups ({split} tokens): all {n:,} = OOV {share(oov)} + ambiguous {share(ambiguous)} + one "
            f"training tag {share(one)}")
    return text + (f"; of the OOV tokens, {share(in_vocab)} are in the vocabulary." if in_vocab else
                   "; no OOV token is in the vocabulary.")
