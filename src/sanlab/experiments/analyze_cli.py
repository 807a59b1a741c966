"""Argument parsing of ``sanlab analyze`` (kept apart so ``sanlab --help`` imports nothing heavy).

Wired into ``sanlab.cli`` by ``register(sub)``; the analyses are ``sanlab.experiments.analyze``. Every
argument is checked when the command line is read, before any run is loaded.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sanlab.experiments import analyze
from sanlab.files import write_text


def _common(p: argparse.ArgumentParser, *, runs: str) -> None:
    p.add_argument("runs", nargs=runs, metavar="RUN", help="run directory" if runs is None else "run directories")
    p.add_argument("--out", required=True, type=_out_prefix, help="output prefix: writes OUT.md, OUT.csv and OUT.png")


def _tokenizer(name: str) -> str:
    from sacrebleu.metrics import BLEU

    if name not in BLEU.TOKENIZERS:
        raise argparse.ArgumentTypeError(f"unknown sacreBLEU tokenizer {name!r}; choose one of "
                                         f"{', '.join(BLEU.TOKENIZERS)}")
    try:  # set up now, before any run is loaded: some need packages (ja-mecab) or a model download (spm)
        BLEU(tokenize=name)
    except (RuntimeError, ImportError, OSError) as err:
        said = " ".join(str(err).split())  # (sacreBLEU's words for a missing package span lines)
        raise argparse.ArgumentTypeError(f"sacreBLEU's tokenizer {name!r} cannot be used here: {said}") from None
    return name


def _out_prefix(text: str) -> str:
    """Checked when the command line is read, before any run is loaded."""
    if not Path(text).name or text.endswith(("/", "\\")):
        raise argparse.ArgumentTypeError(f"{text!r} names no file: give a prefix such as results/gap "
                                         "(for results/gap.md, .csv, .png)")
    if text.startswith("~"):  # a quoted ~ is not expanded by the shell: it would make a directory named ~
        raise argparse.ArgumentTypeError(f"{text!r} starts with '~', which the shell did not expand; give the path "
                                         "without quotes or spelled out")
    # missing directories are created (``write_outputs``); anything else in the way is refused now.
    # lexists: a dangling symlink is in the way too (mkdir cannot replace it)
    existing = next((p for p in Path(text).absolute().parents if os.path.lexists(p)), None)
    if existing is None or not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{existing} is not a directory, so the directory {Path(text).parent} of "
                                         f"{text!r} cannot be created")
    return text


def _eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--split", help="held-out split (default: the first data.test split, else valid)")
    p.add_argument("--checkpoint", default="best", help="whose hyp-<checkpoint>-<split>.txt to read (default: best)")
    p.add_argument("--references", help="reference file instead of the split's target file")
    p.add_argument("--tokenize", default="13a", type=_tokenizer, help="sacreBLEU tokenizer (default: 13a)")


def _device_arg(p: argparse.ArgumentParser) -> None:
    """Analyses that load a model: where it runs (the analysis itself reads CPU copies)."""
    p.add_argument("--device", default="auto", help="where the model runs: auto (CUDA when available) | cpu | "
                   "cuda | cuda:N")


def _edges(text: str) -> tuple[int, ...]:
    from sanlab.evaluation.bleu import bucket_bounds

    expected = "expected comma-separated integers such as 10,20,30,40"
    try:
        edges = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{expected}: got {text!r}") from None
    try:
        bucket_bounds(edges)  # the analysis's own rule, checked before any run loads
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{expected}: {err}") from None
    return edges


def _head(text: str) -> int | None:
    if text == "mean":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a head index or 'mean', got {text!r}")


def _add_provenance(md: Path) -> None:
    """The command line, date and machine under a table written from the command line, so that the file
    says how to make it again."""
    import platform
    from datetime import datetime

    import torch

    from sanlab.invocation import command_line

    stamp = (f"\nCommand: `{command_line()}` ({datetime.now().astimezone():%Y-%m-%d}; "
             f"{platform.system()} {platform.machine()}, torch {torch.__version__}).\n")
    write_text(md, md.read_text(encoding="utf-8") + stamp)


def _report(paths: dict[str, Path]) -> int:
    _add_provenance(paths["md"])
    print(paths["md"].read_text(encoding="utf-8"), end="")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _add_ngram_gap(sub) -> None:
    p = sub.add_parser("ngram-gap", help="n-gram precision gap of runs to a baseline (CSAN Fig. 3)")
    _common(p, runs="+")
    p.add_argument("--baseline", required=True, help="baseline run directory")
    _eval_args(p)
    p.set_defaults(fn=lambda a: _report(analyze.ngram_gap(a.runs, baseline=a.baseline, out=a.out, split=a.split,
                                                  checkpoint=a.checkpoint, references=a.references,
                                                  tokenize=a.tokenize)))


def _add_length_buckets(sub) -> None:
    p = sub.add_parser("length-buckets", help="BLEU by source-length bucket (MUSE Fig. 3)")
    _common(p, runs="+")
    p.add_argument("--buckets", type=_edges, default=(10, 20, 30, 40),
                   help="ascending upper bucket edges in words (default 10,20,30,40: 1-10 ... 31-40, >40)")
    p.add_argument("--sources", help="source file instead of the split's source file")
    p.add_argument("--baseline", help="also test each run's buckets against this run's (paired bootstrap)")
    _bootstrap_args(p, what=" against --baseline")
    _eval_args(p)
    p.set_defaults(fn=lambda a: _report(analyze.length_buckets(a.runs, out=a.out, edges=a.buckets, split=a.split,
                                                       checkpoint=a.checkpoint, sources=a.sources,
                                                       references=a.references, tokenize=a.tokenize,
                                                       baseline=a.baseline,
                                                       bootstrap_samples=a.bootstrap_samples,
                                                       bootstrap_seed=a.bootstrap_seed)))


def _bootstrap_args(p: argparse.ArgumentParser, *, what: str) -> None:
    p.add_argument("--bootstrap-samples", type=int, help=f"resamples per test{what} (default 1000)")
    p.add_argument("--bootstrap-seed", type=int, help="seed (>= 1) of the resampling (default 12345)")


def _add_pairwise(sub) -> None:
    p = sub.add_parser("pairwise", help="every run against every baseline run (seeds): delta BLEU and paired "
                                        "bootstrap of each pair")
    _common(p, runs="+")
    # extend: `--against a --against b` keeps both (with "store" the last one alone, silently)
    p.add_argument("--against", required=True, nargs="+", action="extend", metavar="BASELINE_RUN",
                   help="the baseline's runs (e.g. its seeds); each run is tested against each of them. It takes "
                        "every path up to the next option, so name the RUNs before it; it may be repeated")
    _bootstrap_args(p, what="")
    _eval_args(p)
    p.set_defaults(fn=lambda a: _report(analyze.pairwise(a.runs, against=a.against, out=a.out, split=a.split,
                                                 checkpoint=a.checkpoint, references=a.references,
                                                 tokenize=a.tokenize, bootstrap_samples=a.bootstrap_samples,
                                                 bootstrap_seed=a.bootstrap_seed)))


def _add_sweep(sub) -> None:
    p = sub.add_parser("sweep", help="score against a config value swept across runs (CSAN Fig. 2)")
    _common(p, runs="+")
    p.add_argument("--key", required=True, help="dotted config key, e.g. model.encoder.attention.parts.0.window_size")
    p.add_argument("--metric", help="default: with --from valid, the runs' train.best_metric (unset: bleu for "
                   "translation, accuracy for tagging), one for all runs and the baseline; with --from eval, bleu / "
                   "all (tagging)")
    p.add_argument("--from", dest="score_from", choices=("valid", "eval"), default="valid",
                   help="best validation record of metrics.jsonl (default) or eval-<checkpoint>.json (a "
                   "comparison cell without one: its compare-eval.json)")
    p.add_argument("--split", help="with --from eval: the split (default: the first in the file)")
    p.add_argument("--checkpoint", default="best", help="with --from eval: whose eval-<checkpoint>.json (default: best)")
    p.add_argument("--baseline", help="a run drawn as a dashed line")
    p.set_defaults(fn=lambda a: _report(analyze.sweep(a.runs, key=a.key, out=a.out, metric=a.metric, score_from=a.score_from,
                                              split=a.split, checkpoint=a.checkpoint, baseline=a.baseline)))


def _add_gates_and_curves(sub) -> None:
    p = sub.add_parser("gates", help="MUSE kernel-gate weights per layer (MUSE Fig. 4)")
    _common(p, runs=None)
    p.add_argument("--checkpoint", default="best", help="best (default) | last | averaged | step-N | a checkpoint "
                   "directory")
    _device_arg(p)
    p.set_defaults(fn=lambda a: _report(analyze.gates(a.runs, out=a.out, checkpoint=a.checkpoint, device=a.device)))

    p = sub.add_parser("curves", help="a metric over training steps, one line per run (Dufter Fig. 2)")
    _common(p, runs="+")
    p.add_argument("--metric", help="metric name in metrics.jsonl (default: the runs' train.best_metric, unset: "
                   "bleu for translation, accuracy for tagging; one for all runs), or a shell-style pattern for "
                   "several ('*log_gamma_q*'): one line per run and matching metric")
    p.add_argument("--split", default="valid",
                   help="record split in metrics.jsonl: valid (default), train, speed, diagnostics")
    p.add_argument("--mean-over-seeds", action="store_true",
                   help="one line per variant: the mean of its seed-N runs (comparison cells)")
    p.set_defaults(fn=lambda a: _report(analyze.curves(a.runs, out=a.out, metric=a.metric, split=a.split,
                                               mean_over_seeds=a.mean_over_seeds)))


def _add_attention(sub) -> None:
    p = sub.add_parser("attention", help="heat map of one layer/head of a trained model on one sentence")
    _common(p, runs=None)
    p.add_argument("--sentence", required=True, help="source sentence (translation) or words (tagging)")
    p.add_argument("--side", choices=tuple(analyze.SIDE_NAMES), default="encoder",
                   help="encoder self-attention, decoder self-attention or decoder cross-attention")
    p.add_argument("--layer", type=int, default=0, help="0-based layer index (default 0)")
    p.add_argument("--head", type=_head, default=0, help="head index or 'mean' (default 0)")
    p.add_argument("--target", help="decoder sides: target text (default: the model's own translation)")
    p.add_argument("--stage", choices=("final", "weights", "weights_final", "scores"), default="final",
                   help="final (default): the weights applied to the values")
    p.add_argument("--checkpoint", default="best", help="best (default) | last | averaged | step-N | a checkpoint "
                   "directory")
    _device_arg(p)
    p.set_defaults(fn=lambda a: _report(analyze.attention_map(a.runs, out=a.out, sentence=a.sentence, side=a.side,
                                                      layer=a.layer, head=a.head, target=a.target,
                                                      stage=a.stage, checkpoint=a.checkpoint, device=a.device)))


def register(subparsers) -> None:
    """Add ``sanlab analyze <analysis>`` to the ``sanlab`` parser's subcommands."""
    parser = subparsers.add_parser("analyze", help="analysis tables and plots of trained runs (the papers' figures)",
                                   description="Each analysis writes OUT.md, OUT.csv and OUT.png.")
    sub = parser.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS")
    for add in (_add_ngram_gap, _add_length_buckets, _add_pairwise, _add_sweep, _add_gates_and_curves, _add_attention):
        add(sub)
