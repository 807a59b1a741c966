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

Here: ``sweep`` and ``curves``, which read a run's scores and training records; the entry points that
score hypotheses are in ``analyze_bleu``, those that load a model in ``analyze_models``, what all of them
read and write in ``analyze_inputs``. Every entry point (and ``run_labels``, ``run_score``) is
importable from here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

from sanlab.errors import ConfigError
from sanlab.experiments.analyze_bleu import length_buckets, ngram_gap, pairwise  # noqa: F401  (re-exported)
from sanlab.experiments.analyze_inputs import (  # run_labels, run_score: also imported from here
    PathLike,
    checked,
    default_eval_split,
    distinct_runs,
    load_config_of,
    one_split_data,
    run_labels,
    run_score,
    shared_metric,
    write_outputs,
)
from sanlab.experiments.analyze_models import SIDE_NAMES, attention_map, gates  # noqa: F401  (re-exported)
from sanlab.training.layout import RunLayout


def sweep(run_dirs: Sequence[PathLike], *, key: str, out: PathLike, metric: str | None = None,
          score_from: str = "valid", split: str | None = None, checkpoint: str = "best",
          baseline: PathLike | None = None) -> dict[str, Path]:
    """Score against the config value at dotted ``key`` across runs (CSAN Fig. 2); seeds are averaged."""
    from sanlab.evaluation import analysis_curves, plots

    run_dirs = distinct_runs(run_dirs)
    scored = [*run_dirs, *([baseline] if baseline is not None else [])]
    metric, points = metric or shared_metric(scored, score_from=score_from), []
    if score_from == "eval" and split is None:  # one split for every run and the baseline
        split = default_eval_split(run_dirs[0], checkpoint)
    # every point, and the baseline, scored on the same sentences
    one_split_data(scored, split if score_from == "eval" else None)
    for label, run in zip(run_labels(run_dirs), run_dirs):
        value = checked(analysis_curves.dotted_value, load_config_of(run), key, context=str(RunLayout(run).config))
        if value is None:
            raise ConfigError(f"{RunLayout(run).config}: {key} is not set (null), so the run cannot be placed on the sweep's "
                              "axis; sweep the value it trained with (for a window part: "
                              "...parts.N.window_size, whether M was given as size, half_width or the default)")
        score, source = run_score(run, metric=metric, score_from=score_from, split=split, checkpoint=checkpoint)
        points.append(analysis_curves.SweepPoint(run=label, value=value, score=score, source=source))
    reference = None
    if baseline is not None:
        base_score, base_source = run_score(baseline, metric=metric, score_from=score_from, split=split,
                                            checkpoint=checkpoint)
        reference = (f"baseline {run_labels([baseline])[0]}", base_score)
    table = analysis_curves.sweep_table(points, key=key)
    if reference is not None:
        table = dataclasses.replace(table, rows=table.rows + ((reference[0], None, reference[1], base_source),))
    means = analysis_curves.sweep_means(points)
    notes = ("Runs sharing a value (seeds) are averaged on the plotted line; the dots are single runs."
             + (" The dashed line is the baseline." if reference else "")
             + (f" Scores are the best validation record logged during training{_how_validated(metric)}, a quick "
                "look that flatters every run a little; `--from eval` uses the beam-search scores of `sanlab "
                "evaluate`." if score_from == "valid" else ""))
    return write_outputs(out, title=f"Sweep over {key}", table=table, notes=notes, plot=lambda png: plots.lines(
        png, series={"mean": ([m[0] for m in means], [m[1] for m in means])},
        points={"runs": ([p.value for p in points], [p.score for p in points])}, reference=reference,
        title=f"{metric} against {key.rsplit('.', 1)[-1]}", xlabel=key, ylabel=metric))


def _how_validated(metric: str) -> str:
    """How a validation record's ``metric`` was scored, for the sweep's note ("" where sanlab cannot say)."""
    if metric == "bleu":  # translation's validation decodes only for it
        return " (greedy decoding of the first `train.valid_max_sentences` sentences)"
    if metric in ("loss", "ppl"):
        return (f" ({metric}: the loss over every validation pair, those `data.filter_valid` keeps where set; "
                "no decoding)")
    return ""


def curves(run_dirs: Sequence[PathLike], *, out: PathLike, metric: str | None = None,
           split: str = "valid", mean_over_seeds: bool = False) -> dict[str, Path]:
    """``metric`` of the ``split`` records of each run's ``metrics.jsonl`` against the step (Dufter Fig. 2).

    ``mean_over_seeds``: comparison cells ``<variant>/seed-N`` of one variant become one line, their mean."""
    from sanlab.evaluation import analysis_curves, plots
    from sanlab.training.logging import read_metrics

    run_dirs = distinct_runs(run_dirs)
    for run in run_dirs:  # a mistyped path is "not a run", not "no records"
        if not RunLayout(run).config.is_file():
            raise ConfigError(f"{run}: not a run directory (no {RunLayout(run).config.name})")
    metric = metric or shared_metric(run_dirs)
    found = {}
    for label, run in zip(run_labels(run_dirs), run_dirs):
        records, context = read_metrics(Path(run)), str(RunLayout(run).metrics)
        names = checked(analysis_curves.metric_names, records, pattern=metric, split=split, context=context)
        # a pattern (``*gamma*``) gives one line per matching metric; diagnostics that share their name after
        # "/" are told apart by their module path alone
        shared = len({n.partition("/")[2] for n in names}) == 1 and all("/" in n for n in names)
        for name in names:
            key = label if len(names) == 1 else f"{label}: {name.partition('/')[0] if shared else name}"
            found[key] = checked(analysis_curves.learning_curve, records, metric=name, split=split, context=context)
    labels = list(found)
    notes = (f"`{split}` records of each run's metrics.jsonl; a step logged twice (resumed run) keeps its "
             "later record.")
    spreads = {}
    if mean_over_seeds:
        # only cells are averaged: a run that is no cell keeps its line, even one named as a cell's variant
        seed = re.compile(r"/seed-\d+(?=: |$)")  # (": metric" kept)
        group_of = {label: seed.sub("", label) for label in labels if seed.search(label)}
        spreads = checked(analysis_curves.seed_curves, {label: found[label] for label in group_of}, group_of,
                          context="--mean-over-seeds")
        means = {line: [(step, mean) for step, mean, _ in points] for line, points in spreads.items()}
        mean_of = {group: f"{group} (mean of {list(group_of.values()).count(group)})" for group in group_of.values()}
        found = {mean_of[group_of[label]] if label in group_of else label:
                 means[mean_of[group_of[label]]] if label in group_of else found[label] for label in labels}
        notes += (" Each line of comparison cells (`<variant>/seed-N`) is the mean over the seeds of one variant, at "
                  "the steps all of them logged (a seed that stopped early ends its line there), so every point of a "
                  "line averages the n seeds its label names (`mean of n`); any other run keeps its own line. The "
                  "shaded band around a line of two or more seeds is ±1 sample sd (n - 1) of its seeds, which the "
                  "`<line> sd` columns after the lines give.")
    bands = {line: ([s for s, _, _ in points], [m - sd for _, m, sd in points], [m + sd for _, m, sd in points])
             for line, points in spreads.items() if all(sd is not None for _, _, sd in points)}
    return write_outputs(out, title=f"Learning curves: {split} {metric}",
                         table=analysis_curves.curves_table(found, spreads=spreads), notes=notes,
                         plot=lambda png: plots.lines(
                             png, series={k: ([s for s, _ in v], [y for _, y in v]) for k, v in found.items()},
                             bands=bands, title=f"{split} {metric} during training", xlabel="step", ylabel=metric))
