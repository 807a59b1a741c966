"""The ``sanlab analyze`` entry points that score the hypotheses of translation runs against references:
``ngram_gap`` (CSAN Fig. 3, n-gram precision gap to a baseline), ``length_buckets`` (MUSE Fig. 3, BLEU by
source-length bucket, optionally tested against a baseline) and ``pairwise`` (every run against every
baseline run, with sacreBLEU's paired bootstrap). They never decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sanlab.errors import ConfigError
from sanlab.experiments.analyze_inputs import (
    PathLike,
    baselines_first,
    bootstrap_options,
    checked,
    translation_inputs,
    write_outputs,
)


def ngram_gap(run_dirs: Sequence[PathLike], *, baseline: PathLike, out: PathLike, split: str | None = None,
              checkpoint: str = "best", references: PathLike | None = None, tokenize: str = "13a") -> dict[str, Path]:
    """Per-order n-gram precision of each run and its gap to ``baseline`` (CSAN Fig. 3)."""
    from sanlab.evaluation import analysis_bleu, plots

    data = translation_inputs(baselines_first([baseline], run_dirs), split=split, checkpoint=checkpoint,
                              references=references, need_sources=False)
    base_label = next(iter(data["hypotheses"]))
    gaps = analysis_bleu.ngram_gaps(data["hypotheses"], data["references"], baseline=base_label, tokenize=tokenize)
    orders = sorted({g.order for g in gaps})
    series = {s: [next(g.gap for g in gaps if g.system == s and g.order == n) for n in orders]
              for s in data["hypotheses"] if s != base_label}
    notes = (f"Split `{data['split']}` ({len(data['references'])} sentences), checkpoint `{checkpoint}`, "
             f"sacreBLEU tokenizer `{tokenize}`. precision = clipped n-gram matches / hypothesis n-grams "
             f"(%, unsmoothed); gap = precision - precision of the baseline `{base_label}` (points).")
    return write_outputs(out, title=f"n-gram precision gap to {base_label}", table=analysis_bleu.ngram_gap_table(gaps),
                         notes=notes, plot=lambda png: plots.grouped_bars(
                             png, groups=[f"{n}-gram" for n in orders], series=series, hline=0.0,
                             title=f"Gap of n-gram precision to {base_label}", xlabel="n-gram order",
                             ylabel="precision gap (points)"))


def source_lengths(sources: Sequence[str]) -> list[int]:
    """Length of each raw (untokenised, un-segmented) source sentence in words split at spaces and tabs, as
    ``sanlab tag`` reads a line (``plain_words``; compare-mt splits at ASCII spaces too): a no-break space
    ("10\u00a0000") or another Unicode space joins, it does not split. (Here, not in ``evaluation``: the word
    rule belongs to the data floor, which ``evaluation`` does not import.)"""
    from sanlab.data.conllu_io import plain_words

    return [len(plain_words(s)) for s in sources]


def length_buckets(run_dirs: Sequence[PathLike], *, out: PathLike, edges: Sequence[int] = (10, 20, 30, 40),
                   split: str | None = None, checkpoint: str = "best", sources: PathLike | None = None,
                   references: PathLike | None = None, tokenize: str = "13a", baseline: PathLike | None = None,
                   bootstrap_samples: int | None = None, bootstrap_seed: int | None = None) -> dict[str, Path]:
    """Corpus BLEU per source-length bucket (words of the raw source) for each run (MUSE Fig. 3); with
    ``baseline``, each run's bucket is also tested against the baseline's (paired bootstrap, by default
    1000 resamples with seed 12345, as ``sanlab compare``)."""
    from sanlab.evaluation import analysis_bleu, plots

    if baseline is None and (bootstrap_samples is not None or bootstrap_seed is not None):
        raise ConfigError("--bootstrap-samples and --bootstrap-seed set the test against --baseline: "
                          "give a baseline or drop them")
    bootstrap_samples, bootstrap_seed = bootstrap_options(bootstrap_samples, bootstrap_seed)
    runs = baselines_first([] if baseline is None else [baseline], run_dirs)  # the baseline first; each run once
    data = translation_inputs(runs, split=split, checkpoint=checkpoint, sources=sources, references=references)
    lengths = source_lengths(data["sources"])
    base_label = next(iter(data["hypotheses"])) if baseline is not None else None
    scores = checked(analysis_bleu.length_buckets, data["hypotheses"], data["references"], lengths, edges=edges,
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
    table = analysis_bleu.length_bucket_table(scores, tested=base_label is not None)
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

    from sanlab.evaluation import analysis_bleu, plots
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
    results = analysis_bleu.pairwise_tests(data["hypotheses"], data["references"], baselines=bases, tokenize=tokenize,
                                      n_samples=samples, seed=seed)
    tested = {r.baseline: r.baseline_bleu for r in results} | {r.system: r.bleu for r in results}
    scores = {name: tested[name] if name in tested  # the bootstrap scored it already
              else corpus_scores(data["hypotheses"][name], data["references"], tokenize=tokenize).bleu
              for name in labels}
    wide, long = analysis_bleu.pairwise_tables(results, scores, baselines=bases)
    notes = (f"Split `{data['split']}` ({len(data['references'])} sentences), checkpoint `{checkpoint}`, sacreBLEU "
             f"tokenizer `{tokenize}`. Each cell: BLEU of the row's run - BLEU of the column's run, and p of "
             f"sacreBLEU's paired bootstrap ({samples} resamples, seed {seed}{smallest_p_warning(samples)}); "
             "⇑/⇓ p < 0.01, ↑/↓ p < 0.05, where p is in effect one-sided in the direction of the difference "
             "(↑ is a two-sided 10% level), so among many tests some fall below 0.05 by chance. Blank: a run against "
             "itself." + (f" Baselines' mean BLEU {sum(scores[b] for b in bases) / len(bases):.2f}; its column is a "
                         "plain difference (untested), and a baseline's own row counts that run in the mean."
                         if len(bases) > 1 else "")
             + (f"\n\nsacreBLEU signature: `BLEU|{results[0].signature}`" if results else ""))
    by = {(r.system, r.baseline): r for r in results}
    deltas = np.array([[by[(s, b)].delta if (s, b) in by else np.nan for b in bases] for s in labels])
    marks = [[by[(s, b)].mark if (s, b) in by else "" for b in bases] for s in labels]
    return write_outputs(out, title=f"Every run against every baseline run ({data['split']})", table=wide,
                         csv_table=long, notes=notes, plot=lambda png: plots.delta_grid(
                             png, deltas=deltas, marks=marks, row_labels=labels, column_labels=bases,
                             title="BLEU difference to each baseline run", colorbar_label="Δ BLEU"))
