"""``sanlab analyze``: the papers' analysis figures, from run directories.

Every entry point takes run directories and an output prefix ``out`` and writes ``<out>.md``
(title, table, how the numbers were computed), ``<out>.csv`` (full precision) and ``<out>.png``:

    ngram_gap       CSAN (arXiv 1904.03107) Fig. 3: n-gram precision gap of systems to a baseline
    length_buckets  MUSE (arXiv 1911.09483) Fig. 3: BLEU by source-length bucket
    pairwise        every run against every baseline run (seeds): Δ BLEU and the paired bootstrap of each pair
    sweep           CSAN Fig. 2: score against a config value swept across runs (window, heads)
    gates           MUSE Fig. 4: kernel-gate weights per layer of a trained MUSE run
    curves          Dufter et al. (COLING 2020) Fig. 2: a validation metric over training steps
    attention_map   one layer/head of a trained model on one sentence (2D-CSAN: one block per head offset)

Translation analyses read the hypotheses ``sanlab evaluate`` wrote (``hyp-<checkpoint>-<split>.txt``);
they never decode. The computations live in ``sanlab.evaluation.analysis``, the drawing in
``sanlab.evaluation.plots``. Heavy modules (torch, matplotlib) are imported inside the functions
so that importing this module (``analyze_cli`` does, for ``sanlab --help``) costs nothing at start-up.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sanlab.errors import ConfigError, DataError
from sanlab.files import read_json, write_text
from sanlab.training.layout import RunLayout

PathLike = str | Path
SIDE_NAMES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
              "cross": "decoder cross-attention"}


# ----------------------------------------------------------------------------- shared plumbing
def run_labels(run_dirs: Sequence[PathLike]) -> list[str]:
    """Shortest path suffixes that tell the runs apart (``runs/csan2d``, ``runs/base`` -> csan2d, base);
    a comparison cell (``<variant>/seed-N``) always keeps its variant."""
    parts = [Path(r).resolve().parts for r in run_dirs]
    least = [2 if re.fullmatch(r"seed-\d+", p[-1]) else 1 for p in parts]
    for depth in range(1, max((len(p) for p in parts), default=1) + 1):
        labels = ["/".join(p[-max(depth, k):]) for p, k in zip(parts, least)]
        if len(set(labels)) == len(labels):
            return labels
    return [str(r) for r in run_dirs]


def checked(fn: Callable, *args, context: str, **kwargs) -> Any:
    """Call an analysis function; its input errors (KeyError / IndexError / ValueError) become
    ``ConfigError``s that say which run or option they came from."""
    try:
        return fn(*args, **kwargs)
    except (KeyError, IndexError, ValueError) as err:
        message = err.args[0] if err.args else repr(err)
        raise ConfigError(f"{context}: {message}") from None


def load_config_of(run_dir: PathLike):
    """The run's validated config (defaults filled in; properties such as a window's ``window_size``)."""
    from sanlab.runs import load_run_config

    return load_run_config(Path(run_dir))


def raw_config(run_dir: PathLike) -> dict:
    path = RunLayout(run_dir).config
    if not path.exists():
        raise ConfigError(f"{run_dir}: not a run directory (no {path.name})")
    from sanlab.config_yaml import read_yaml_mapping

    return read_yaml_mapping(path, what="run config")


def write_outputs(out: PathLike, *, title: str, table, notes: str, plot: Callable[[Path], Path],
                  csv_table=None) -> dict[str, Path]:
    """``<out>.md``, ``<out>.csv`` and ``<out>.png`` (``out`` is a prefix: ``results/gap`` -> results/gap.md).
    ``csv_table``: the CSV's own table when the Markdown one is laid out for reading (default: ``table``)."""
    paths = {ext: Path(f"{out}.{ext}") for ext in ("md", "csv", "png")}
    paths["md"].parent.mkdir(parents=True, exist_ok=True)
    write_text(paths["md"], f"# {title}\n\n{table.markdown()}\n{notes.strip()}\n")
    write_text(paths["csv"], (table if csv_table is None else csv_table).csv())
    plot(paths["png"])
    return paths


def _translation_config(run_dir: PathLike):
    """The config of a run whose task writes hypotheses to analyse (``Task.supports("bleu-analysis")``)."""
    from sanlab.runs import load_run_config
    from sanlab.tasks.base import task_for

    config = load_run_config(Path(run_dir))
    task_for(config).require("bleu-analysis", run_dir)
    return config


def held_out_split(config, split: str | None) -> tuple[str, Any]:
    """(name, ParallelFiles) of a held-out split: ``split``, else the first ``data.test`` split, else valid."""
    files = {**dict(config.data.test), "valid": config.data.valid}
    name = split or next(iter(config.data.test), "valid")
    if name not in files:
        raise ConfigError(f"unknown split {name!r}; the runs have: {', '.join(files)}")
    return name, files[name]


def load_hypotheses(run_dir: PathLike, *, checkpoint: str, split: str, expected: int) -> list[str]:
    """The hypotheses ``sanlab evaluate`` wrote for (checkpoint, split), checked against the references."""
    path = RunLayout(run_dir).hypotheses(checkpoint, split)
    if not path.exists():
        raise ConfigError(f"{path} not found: decode first with "
                          f"`sanlab evaluate --run {run_dir} --checkpoint {checkpoint} --split {split}`")
    from sanlab.tasks.translation import read_hypotheses

    record = RunLayout(run_dir).eval_record(checkpoint)  # written with the hypotheses
    results = read_json(record) or {}
    if isinstance(results.get(split), dict):
        check_current(record, results, split, run_dir=run_dir, checkpoint=checkpoint)
    hyps = read_hypotheses(path)
    if len(hyps) != expected:
        raise DataError(f"{len(hyps)} hypotheses for {expected} references (is it the same test set?)", path=str(path))
    return hyps


def translation_inputs(run_dirs: Sequence[PathLike], *, split: str | None, checkpoint: str,
                       sources: PathLike | None = None, references: PathLike | None = None,
                       need_sources: bool = True) -> dict:
    """Sources (unless not ``need_sources``), references (from the first run's config, or the given files)
    and each run's hypotheses."""
    from sanlab.data.parallel import open_text, read_parallel

    configs = [_translation_config(r) for r in run_dirs]
    name, files = held_out_split(configs[0], split)
    from_config = not references or (need_sources and not sources)
    pairs = read_parallel(files.src, files.tgt, keep_empty=True) if from_config else []  # every line, as scored
    refs = list(open_text(references)) if references else [t for _, t in pairs]
    src = (list(open_text(sources)) if sources else [s for s, _ in pairs]) if need_sources else None
    if src is not None and len(src) != len(refs):
        raise DataError(f"{len(src)} sources but {len(refs)} references", path=str(sources or references))
    labels = run_labels(run_dirs)
    hyps = {label: load_hypotheses(r, checkpoint=checkpoint, split=name, expected=len(refs))
            for label, r in zip(labels, run_dirs)}
    return {"split": name, "sources": src, "references": refs, "hypotheses": hyps}


def bootstrap_options(samples: int | None, seed: int | None) -> tuple[int, int]:
    """(resamples, seed) of a paired bootstrap, by default 1000 and 12345 as in ``sanlab compare``."""
    samples = 1000 if samples is None else samples
    seed = 12345 if seed is None else seed
    if samples < 1 or seed < 1:  # sacreBLEU would take seed 0 as "unseeded"
        raise ConfigError(f"--bootstrap-samples and --bootstrap-seed must be >= 1, got {samples} and {seed}")
    return samples, seed


def baselines_first(baselines: Sequence[PathLike], runs: Sequence[PathLike]) -> list[Path]:
    """The baseline runs, then the other runs, each run once (a run may be named in both lists)."""
    ordered: dict[Path, Path] = {}
    for run in [*baselines, *runs]:
        ordered.setdefault(Path(run).resolve(), Path(run))
    return list(ordered.values())


# ----------------------------------------------------------------------------- the analyses
def ngram_gap(run_dirs: Sequence[PathLike], *, baseline: PathLike, out: PathLike, split: str | None = None,
              checkpoint: str = "best", references: PathLike | None = None, tokenize: str = "13a") -> dict[str, Path]:
    """Per-order n-gram precision of each run and its gap to ``baseline`` (CSAN Fig. 3)."""
    from sanlab.evaluation import analysis, plots

    data = translation_inputs(baselines_first([baseline], run_dirs), split=split, checkpoint=checkpoint,
                              references=references, need_sources=False)
    base_label = next(iter(data["hypotheses"]))
    gaps = analysis.ngram_gaps(data["hypotheses"], data["references"], baseline=base_label, tokenize=tokenize)
    orders = sorted({g.order for g in gaps})
    series = {s: [next(g.gap for g in gaps if g.system == s and g.order == n) for n in orders]
              for s in data["hypotheses"] if s != base_label}
    notes = (f"Split `{data['split']}` ({len(data['references'])} sentences), checkpoint `{checkpoint}`, "
             f"sacreBLEU tokenizer `{tokenize}`. precision = clipped n-gram matches / hypothesis n-grams "
             f"(%, unsmoothed); gap = precision - precision of the baseline `{base_label}` (points).")
    return write_outputs(out, title=f"n-gram precision gap to {base_label}", table=analysis.ngram_gap_table(gaps),
                         notes=notes, plot=lambda png: plots.grouped_bars(
                             png, groups=[f"{n}-gram" for n in orders], series=series, hline=0.0,
                             title=f"Gap of n-gram precision to {base_label}", xlabel="n-gram order",
                             ylabel="precision gap (points)"))


def length_buckets(run_dirs: Sequence[PathLike], *, out: PathLike, edges: Sequence[int] = (10, 20, 30, 40),
                   split: str | None = None, checkpoint: str = "best", sources: PathLike | None = None,
                   references: PathLike | None = None, tokenize: str = "13a", baseline: PathLike | None = None,
                   bootstrap_samples: int | None = None, bootstrap_seed: int | None = None) -> dict[str, Path]:
    """Corpus BLEU per source-length bucket (words of the raw source) for each run (MUSE Fig. 3); with
    ``baseline``, each run's bucket is also tested against the baseline's (paired bootstrap, by default
    1000 resamples with seed 12345, as ``sanlab compare``)."""
    from sanlab.evaluation import analysis, plots

    if baseline is None and (bootstrap_samples is not None or bootstrap_seed is not None):
        raise ConfigError("--bootstrap-samples and --bootstrap-seed set the test against --baseline: "
                          "give a baseline or drop them")
    bootstrap_samples, bootstrap_seed = bootstrap_options(bootstrap_samples, bootstrap_seed)
    runs = baselines_first([] if baseline is None else [baseline], run_dirs)  # the baseline first; each run once
    data = translation_inputs(runs, split=split, checkpoint=checkpoint, sources=sources, references=references)
    lengths = analysis.source_lengths(data["sources"])
    base_label = next(iter(data["hypotheses"])) if baseline is not None else None
    scores = checked(analysis.length_buckets, data["hypotheses"], data["references"], lengths, edges=edges,
                     tokenize=tokenize, baseline=base_label, n_samples=bootstrap_samples, seed=bootstrap_seed,
                     context="--buckets")
    buckets = list(dict.fromkeys(s.bucket for s in scores))
    counts = {s.bucket: s.count for s in scores}
    series = {name: [s.bleu for s in scores if s.system == name] for name in data["hypotheses"]}
    notes = (f"Split `{data['split']}`, checkpoint `{checkpoint}`; source length in whitespace words of the raw "
             f"source; each bucket scored as its own corpus (sacreBLEU `{tokenize}`, its own brevity penalty). "
             "Sentences per bucket: " + ", ".join(f"{b}: {counts[b]}" for b in buckets) + ".")
    if base_label is not None:
        notes += (f" delta = BLEU - BLEU of the baseline `{base_label}` on the same sentences; p: sacreBLEU's paired "
                  f"bootstrap within the bucket ({bootstrap_samples} resamples, seed {bootstrap_seed}); "
                  "sig: ⇑/⇓ p < 0.01, ↑/↓ p < 0.05.")
    table = analysis.length_bucket_table(scores, tested=base_label is not None)
    return write_outputs(out, title="BLEU by source length", table=table, notes=notes,
                         plot=lambda png: plots.grouped_bars(
                             png, groups=[f"{b}\n(n={counts[b]})" for b in buckets], series=series,
                             title="BLEU by source sentence length", xlabel="source length (words)", ylabel="BLEU"))


def pairwise(run_dirs: Sequence[PathLike], *, against: Sequence[PathLike], out: PathLike, split: str | None = None,
             checkpoint: str = "best", references: PathLike | None = None, tokenize: str = "13a",
             bootstrap_samples: int | None = None, bootstrap_seed: int | None = None) -> dict[str, Path]:
    """Every run against every run of ``against`` (the baseline's seeds): Δ BLEU and sacreBLEU's paired
    bootstrap for each pair, and Δ to the baselines' mean BLEU. The baseline runs are tested against one
    another too, which shows how far apart the baseline's own seeds are."""
    import numpy as np

    from sanlab.evaluation import analysis, plots
    from sanlab.evaluation.bleu import corpus_scores
    from sanlab.evaluation.significance import smallest_p_warning

    if not against:
        raise ConfigError("--against needs at least one baseline run")
    samples, seed = bootstrap_options(bootstrap_samples, bootstrap_seed)
    base_runs = baselines_first(against, [])
    data = translation_inputs(baselines_first(base_runs, run_dirs), split=split, checkpoint=checkpoint,
                              references=references, need_sources=False)
    labels = list(data["hypotheses"])
    bases = labels[:len(base_runs)]
    results = analysis.pairwise_tests(data["hypotheses"], data["references"], baselines=bases, tokenize=tokenize,
                                      n_samples=samples, seed=seed)
    tested = {r.baseline: r.baseline_bleu for r in results} | {r.system: r.bleu for r in results}
    scores = {name: tested[name] if name in tested  # the bootstrap scored it already
              else corpus_scores(data["hypotheses"][name], data["references"], tokenize=tokenize).bleu
              for name in labels}
    wide, long = analysis.pairwise_tables(results, scores, baselines=bases)
    notes = (f"Split `{data['split']}` ({len(data['references'])} sentences), checkpoint `{checkpoint}`, sacreBLEU "
             f"tokenizer `{tokenize}`. Each cell: BLEU of the row's run - BLEU of the column's run, and p of "
             f"sacreBLEU's paired bootstrap ({samples} resamples, seed {seed}{smallest_p_warning(samples)}); "
             "⇑/⇓ p < 0.01, ↑/↓ p < 0.05, where p is in effect one-sided in the direction of the difference "
             "(↑ is a two-sided 10% level), so among many tests some fall below 0.05 by chance. Blank: a run against "
             "itself." + (f" Baselines' mean BLEU {sum(scores[b] for b in bases) / len(bases):.2f}; its column is a "
                         "plain difference (untested), and a baseline's own row counts that run in the mean."
                         if len(bases) > 1 else ""))
    by = {(r.system, r.baseline): r for r in results}
    deltas = np.array([[by[(s, b)].delta if (s, b) in by else np.nan for b in bases] for s in labels])
    marks = [[by[(s, b)].mark if (s, b) in by else "" for b in bases] for s in labels]
    return write_outputs(out, title=f"Every run against every baseline run ({data['split']})", table=wide,
                         csv_table=long, notes=notes, plot=lambda png: plots.delta_grid(
                             png, deltas=deltas, marks=marks, row_labels=labels, column_labels=bases,
                             title="BLEU difference to each baseline run", colorbar_label="Δ BLEU"))


def default_metric(run_dir: PathLike, *, score_from: str = "valid") -> str:
    """The task's validation metric (bleu, accuracy) in validation records, its primary score (bleu, all) in
    ``eval-*.json``."""
    from sanlab.config import TASKS  # the raw config's task: the metrics file is read whatever the rest holds
    from sanlab.tasks.base import task_named

    name = raw_config(run_dir).get("task")
    if name not in TASKS.references():
        raise ConfigError(f"{RunLayout(run_dir).config}: task {name!r} is not a known task "
                          f"({', '.join(TASKS.names())}); give --metric")
    task = task_named(name)
    return task.metric if score_from == "valid" else task.eval_metric


def run_score(run_dir: PathLike, *, metric: str | None, score_from: str, split: str | None,
              checkpoint: str) -> tuple[float, str]:
    """(score, where it came from) of a run: its best validation record, or ``eval-<checkpoint>.json``."""
    from sanlab.evaluation import analysis
    from sanlab.training.loop import read_metrics

    metric = metric or default_metric(run_dir, score_from=score_from)
    if score_from == "valid":
        step, score = checked(analysis.best_validation, read_metrics(Path(run_dir)), metric=metric,
                              context=str(RunLayout(run_dir).metrics))
        return score, f"valid {metric}, step {step}"
    if score_from != "eval":
        raise ConfigError(f"score_from must be 'valid' or 'eval', got {score_from!r}")
    path = RunLayout(run_dir).eval_record(checkpoint)
    if not path.exists():
        raise ConfigError(f"{path} not found: run `sanlab evaluate --run {run_dir} --checkpoint {checkpoint}` first")
    results = json.loads(path.read_text(encoding="utf-8"))
    name = split or next(iter(results))
    if name not in results or not isinstance(results[name].get(metric), (int, float)):
        numeric = [k for k, v in results.get(name, {}).items() if isinstance(v, (int, float))]
        raise ConfigError(f"{path}: no {metric!r} for split {name!r} (splits: {', '.join(results)}; "
                          f"metrics: {', '.join(numeric)})")
    check_current(path, results, name, run_dir=run_dir, checkpoint=checkpoint)
    return float(results[name][metric]), f"{path.name} {name} {metric}"


def check_current(path: Path, results: dict, name: str, *, run_dir: PathLike, checkpoint: str) -> None:
    """The ``name`` record of ``path`` (eval-<checkpoint>.json) scored the weights that ``checkpoint`` names
    now; otherwise (the run trained on, or was averaged again) its scores and hypotheses are stale."""
    named = [k for k, r in results.items() if isinstance(r, dict) and "checkpoint" in r]
    if named and "checkpoint" not in results[name]:  # kept by `evaluate` beside newer records: maybe stale
        raise ConfigError(f"{path}: the {name!r} record is from before records named their checkpoint, while "
                          f"{', '.join(named)} name theirs, so it may come from other weights: run `sanlab evaluate "
                          f"--run {run_dir} --checkpoint {checkpoint} --split {name}` again")
    if "checkpoint" in results[name]:  # files from before the record named its checkpoint are taken as they are
        from sanlab.runs import load_run_config, same_weights, scored_checkpoint

        recorded = results[name]
        now = scored_checkpoint(Path(run_dir), checkpoint, load_run_config(run_dir))
        if not same_weights(recorded, now):
            raise ConfigError(f"{path} scored {recorded['checkpoint']} (step {recorded.get('step')}), but the run's "
                              f"{checkpoint!r} checkpoint is now {now['checkpoint']} (step {now['step']}): run "
                              f"`sanlab evaluate --run {run_dir} --checkpoint {checkpoint} --split {name}` again")


def sweep(run_dirs: Sequence[PathLike], *, key: str, out: PathLike, metric: str | None = None,
          score_from: str = "valid", split: str | None = None, checkpoint: str = "best",
          baseline: PathLike | None = None) -> dict[str, Path]:
    """Score against the config value at dotted ``key`` across runs (CSAN Fig. 2); seeds are averaged."""
    from sanlab.evaluation import analysis, plots

    metric, points = metric or default_metric(run_dirs[0], score_from=score_from), []
    for label, run in zip(run_labels(run_dirs), run_dirs):
        value = checked(analysis.dotted_value, load_config_of(run), key, context=str(RunLayout(run).config))
        if value is None:
            raise ConfigError(f"{RunLayout(run).config}: {key} is not set (null), so the run cannot be placed on the sweep's "
                              "axis; sweep the value it trained with (for a window part: "
                              "...parts.N.window_size, whether M was given as size, half_width or the default)")
        score, source = run_score(run, metric=metric, score_from=score_from, split=split, checkpoint=checkpoint)
        points.append(analysis.SweepPoint(run=label, value=value, score=score, source=source))
    reference = None
    if baseline is not None:
        base_score, base_source = run_score(baseline, metric=metric, score_from=score_from, split=split,
                                            checkpoint=checkpoint)
        reference = (f"baseline {run_labels([baseline])[0]}", base_score)
    table = analysis.sweep_table(points, key=key)
    if reference is not None:
        table = dataclasses.replace(table, rows=table.rows + ((reference[0], None, reference[1], base_source),))
    means = analysis.sweep_means(points)
    notes = ("Runs sharing a value (seeds) are averaged on the plotted line; the dots are single runs."
             + (" The dashed line is the baseline." if reference else "")
             + (" Scores are the best validation record logged during training (translation: greedy decoding of "
                "the first `train.valid_max_sentences` sentences), a quick look that flatters every run a little; "
                "`--from eval` uses the beam-search scores of `sanlab evaluate`." if score_from == "valid" else ""))
    return write_outputs(out, title=f"Sweep over {key}", table=table, notes=notes, plot=lambda png: plots.lines(
        png, series={"mean": ([m[0] for m in means], [m[1] for m in means])},
        points={"runs": ([p.value for p in points], [p.score for p in points])}, reference=reference,
        title=f"{metric} against {key.rsplit('.', 1)[-1]}", xlabel=key, ylabel=metric))


def gates(run_dir: PathLike, *, out: PathLike, checkpoint: str = "best") -> dict[str, Path]:
    """Gate weight g = softmax(alpha) of each MUSE convolution kernel in every layer (MUSE Fig. 4)."""
    from sanlab.evaluation import analysis, plots
    from sanlab.layers.muse import gate_weights
    from sanlab.runs import load_trained

    _, model, _ = load_trained(Path(run_dir), checkpoint=checkpoint)
    weights = gate_weights(model)
    if not weights:
        raise ConfigError(f"{run_dir}: no MUSE layer with convolution cells (mixer type 'muse') in this model")
    kernels = {name: [cell.kernel_size for cell in model.get_submodule(name).cells] for name in weights}
    rows = analysis.gate_rows({n: w.tolist() for n, w in weights.items()}, kernels)
    layers = sorted({r.layer for r in rows})
    def ratio(stack: str, layer: int) -> float:
        row = next((r for r in rows if r.stack == stack and r.layer == layer), None)
        value = analysis.small_to_large(row) if row is not None else None
        return math.nan if value is None else value  # no bar: no such layer, or a single kernel

    ratios = {stack: [ratio(stack, n) for n in layers] for stack in dict.fromkeys(r.stack for r in rows)}
    notes = (f"Checkpoint `{checkpoint}` of `{run_labels([run_dir])[0]}`. g = softmax(alpha) over the cells of a "
             "layer (MUSE Eq. 7; 1/n at initialisation); layers are 0-based, as in the config's `layers` lists. "
             "small/large = g of the layer's smallest kernel over g of its largest, the bars of MUSE Fig. 4 "
             "(above 1: the layer leans on the small kernel); the plot draws it per layer and stack.")
    return write_outputs(out, title="MUSE kernel gates per layer", table=analysis.gate_table(rows), notes=notes,
                         plot=lambda png: plots.grouped_bars(
                             png, groups=[f"layer {n}" for n in layers], series=ratios, hline=1.0,
                             title="MUSE: small-kernel over large-kernel gate weight per layer",
                             xlabel="layer (0-based)", ylabel="g(smallest k) / g(largest k)"))


def curves(run_dirs: Sequence[PathLike], *, out: PathLike, metric: str | None = None,
           split: str = "valid", mean_over_seeds: bool = False) -> dict[str, Path]:
    """``metric`` of the ``split`` records of each run's ``metrics.jsonl`` against the step (Dufter Fig. 2).

    ``mean_over_seeds``: comparison cells ``<variant>/seed-N`` of one variant become one line, their mean."""
    from sanlab.evaluation import analysis, plots
    from sanlab.training.loop import read_metrics

    metric = metric or default_metric(run_dirs[0])
    found = {}
    for label, run in zip(run_labels(run_dirs), run_dirs):
        records, context = read_metrics(Path(run)), str(RunLayout(run).metrics)
        names = checked(analysis.metric_names, records, pattern=metric, split=split, context=context)
        # a pattern (``*gamma*``) gives one line per matching metric; diagnostics that share their name after
        # "/" are told apart by their module path alone
        shared = len({n.partition("/")[2] for n in names}) == 1 and all("/" in n for n in names)
        for name in names:
            key = label if len(names) == 1 else f"{label}: {name.partition('/')[0] if shared else name}"
            found[key] = checked(analysis.learning_curve, records, metric=name, split=split, context=context)
    labels = list(found)
    notes = (f"`{split}` records of each run's metrics.jsonl; a step logged twice (resumed run) keeps its "
             "later record.")
    if mean_over_seeds:
        group_of = {label: re.sub(r"/seed-\d+(?=: |$)", "", label) for label in labels}  # (": metric" kept)
        found = checked(analysis.mean_curves, found, group_of, context="--mean-over-seeds")
        notes += (" Each line is the mean over the seeds of one variant, at the steps all of them logged "
                  "(a seed that stopped early ends its line there).")
    return write_outputs(out, title=f"Learning curves: {split} {metric}", table=analysis.curves_table(found),
                         notes=notes, plot=lambda png: plots.lines(
                             png, series={k: ([s for s, _ in v], [y for _, y in v]) for k, v in found.items()},
                             title=f"{split} {metric} during training", xlabel="step", ylabel=metric))


def attention_map(run_dir: PathLike, *, out: PathLike, sentence: str, side: str = "encoder", layer: int = 0,
                  head: int | None = 0, target: str | None = None, stage: str = "final",
                  checkpoint: str = "best") -> dict[str, Path]:
    """Heat map of one layer/head (``head`` None: mean over heads) of a trained model on ``sentence``."""
    from sanlab.evaluation import analysis, plots
    from sanlab.experiments.attention_traces import layer_trace

    found = layer_trace(Path(run_dir), sentence=sentence, side=side, layer=layer, target=target,
                        checkpoint=checkpoint)
    where = f"{SIDE_NAMES.get(side, side)}, layer {layer}"
    stage = checked(analysis.trace_stage, found.trace, stage, context=where)
    matrix = checked(analysis.attention_matrix, found.trace, head=head, stage=stage, context=where)
    blocks = checked(analysis.key_blocks, matrix, keys=len(found.keys), context=where)
    many = len(blocks) > 1
    columns = [f"{delta:+d}:{tok}" if many else tok for delta, _ in blocks for tok in found.keys]
    rows = tuple((q, *(float(x) for _, b in blocks for x in b[i])) for i, q in enumerate(found.queries))
    table = analysis.Table(("query", *columns), rows, digits=3)
    head_text = "mean over heads" if head is None else f"head {head}"
    title = f"{run_labels([run_dir])[0]}: {where}, {head_text} ({stage})"
    notes = (f"Checkpoint `{checkpoint}`. Rows: queries, columns: keys." + (f" Target: `{found.target}`." if
             found.target is not None else "") + (" The key axis holds one block per neighbouring head "
                                                 "(2D-CSAN), labelled by head offset delta (keys of head "
                                                 "(h + delta) mod H with the default wrap boundary)." if many else ""))
    return write_outputs(out, title=title, table=table, notes=notes, plot=lambda png: plots.heatmap(
        png, blocks=[(f"head offset {d:+d}" if many else "", b) for d, b in blocks], x_labels=found.keys,
        y_labels=found.queries, title=title, colorbar_label="score" if stage == "scores" else "attention weight"))
