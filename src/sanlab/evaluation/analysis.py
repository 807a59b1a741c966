"""The numbers behind the papers' analysis figures, as pure functions (no files, no models).

- n-gram gap: Yang et al., "Convolutional Self-Attention Networks", NAACL 2019,
  https://arxiv.org/abs/1904.03107, Figure 3 (gain of each n-gram order over the baseline).
- length buckets: Zhao et al., "MUSE: Parallel Multi-Scale Attention for Sequence to Sequence
  Learning", https://arxiv.org/abs/1911.09483, Figure 3 (BLEU by source-sentence length).
- sweep: CSAN Figure 2 (score against the window size M / the number of heads N).
- gates: MUSE Figure 4 (softmax gate weight of each convolution kernel, Eq. 7, per layer).
- learning curves: Dufter, Schmitt & Schuetze, COLING 2020,
  https://aclanthology.org/2020.coling-main.324, Figure 2 (development score over steps).
- pairwise: every run against every run of a baseline (one paired bootstrap each), to show how much a
  variant's mark depends on which baseline seed it meets.
- attention maps: one layer/head of an ``Attention`` trace (``scores`` / ``weights`` /
  ``weights_final``, each [b, h, i, j]); a 2D-CSAN key axis [n*j] is cut into its n head blocks.

``sanlab.experiments.analyze`` reads runs and calls these; ``sanlab.evaluation.plots`` draws.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel

from sanlab.evaluation.bleu import (References, bleu_by_length, length_bucket_members, ngram_precisions,
                                    reference_streams)
from sanlab.evaluation.significance import p_text, paired_bootstrap_bleu

LOWER_IS_BETTER = frozenset({"loss", "ppl"})  # validation metrics where the best record is the minimum


# ----------------------------------------------------------------------------- tables
def _cell(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


@dataclass(frozen=True)
class Table:
    """Rows under named columns; rendered as Markdown (rounded) or CSV (full precision)."""

    columns: tuple[str, ...]
    rows: tuple[tuple, ...]
    digits: int = 2
    column_digits: tuple[tuple[str, int], ...] = ()  # (column, digits) where ``digits`` is not right
    p_columns: tuple[str, ...] = ()  # p-values: rendered by ``p_text`` (never rounded onto 0.01 or 0.05)

    def __post_init__(self):
        bad = [r for r in self.rows if len(r) != len(self.columns)]
        if bad:
            raise ValueError(f"table rows must have {len(self.columns)} cells ({self.columns}), got {bad[0]}")

    def column(self, name: str) -> list:
        return [row[self.columns.index(name)] for row in self.rows]

    def markdown(self) -> str:
        escape = lambda s: s.replace("|", "\\|")  # noqa: E731  (a token may be "|")
        lines = ["| " + " | ".join(escape(c) for c in self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        digits = [dict(self.column_digits).get(c, self.digits) for c in self.columns]
        p_value = [c in self.p_columns for c in self.columns]
        lines += ["| " + " | ".join(escape(p_text(v) if is_p and isinstance(v, float) else _cell(v, d))
                                    for v, d, is_p in zip(row, digits, p_value)) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.columns)
        writer.writerows([["" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row]
                          for row in self.rows])
        return buf.getvalue()


# ----------------------------------------------------------------------------- n-gram gap (CSAN Fig. 3)
@dataclass(frozen=True)
class NgramGap:
    """Order-n precision of one system (clipped matches / hypothesis n-grams, in %) and its gap
    to the baseline's precision of the same order (system - baseline, in points)."""

    system: str
    order: int
    matches: int
    total: int
    precision: float
    gap: float


def ngram_gaps(systems: Mapping[str, Sequence[str]], references: References, *, baseline: str,
               tokenize: str = "13a", lowercase: bool = False) -> list[NgramGap]:
    """Per-order precision of every system (the baseline included, gap 0) against one reference set."""
    if baseline not in systems:
        raise ValueError(f"baseline {baseline!r} is not one of the systems {list(systems)}")
    precisions = {name: ngram_precisions(hyps, references, tokenize=tokenize, lowercase=lowercase)
                  for name, hyps in systems.items()}
    base = {p.order: p.precision for p in precisions[baseline]}
    return [NgramGap(system=name, order=p.order, matches=p.matches, total=p.total, precision=p.precision,
                     gap=p.precision - base[p.order])
            for name, rows in precisions.items() for p in rows]


def ngram_gap_table(gaps: Sequence[NgramGap]) -> Table:
    return Table(("system", "order", "matches", "total", "precision", "gap"),
                 tuple((g.system, g.order, g.matches, g.total, g.precision, g.gap) for g in gaps))


# ----------------------------------------------------------------------------- length buckets (MUSE Fig. 3)
@dataclass(frozen=True)
class BucketScore:
    system: str
    bucket: str      # "1-10", ..., ">40" (a length of 0 counts in the first bucket)
    count: int
    bleu: float      # NaN for an empty bucket
    # against a baseline only (None for the baseline itself, an empty bucket, or no baseline):
    delta: float | None = None    # bleu - the baseline's bleu on the same sentences
    p_value: float | None = None  # sacreBLEU's paired bootstrap within the bucket
    mark: str = ""                # ⇑ ↑ ↓ ⇓ as in the comparison tables


def source_lengths(sources: Sequence[str]) -> list[int]:
    """Length of each raw (untokenised, un-segmented) source sentence in whitespace words."""
    return [len(s.split()) for s in sources]


def length_buckets(systems: Mapping[str, Sequence[str]], references: References, lengths: Sequence[int], *,
                   edges: Sequence[int] = (10, 20, 30, 40), tokenize: str = "13a", baseline: str | None = None,
                   n_samples: int = 1000, seed: int = 12345) -> list[BucketScore]:
    """Corpus BLEU per source-length bucket for each system; ``edges`` are ascending upper bounds.

    With ``baseline`` (a key of ``systems``), every other system's bucket is also tested against the
    baseline's on the same sentences (paired bootstrap): a bucket holds a few hundred sentences at most, so a
    gap of one or two BLEU in one bucket is often noise, and the table should say so."""
    if baseline is not None and baseline not in systems:
        raise KeyError(f"baseline {baseline!r} is not one of the systems ({', '.join(systems)})")
    members = length_bucket_members(lengths, edges)
    streams = reference_streams(references, n_hypotheses=len(lengths))
    scores = []
    for name, hyps in systems.items():
        rows = bleu_by_length(hyps, references, lengths, buckets=edges, tokenize=tokenize)
        for row, (_, _, idx) in zip(rows, members):
            test = None
            if baseline is not None and name != baseline and idx:
                test = paired_bootstrap_bleu([systems[baseline][i] for i in idx], [hyps[i] for i in idx],
                                             [[stream[i] for i in idx] for stream in streams],
                                             n_samples=n_samples, seed=seed, tokenize=tokenize)
            scores.append(BucketScore(system=name, bucket=row.label, count=row.count, bleu=row.bleu,
                                      delta=test.delta if test else None, p_value=test.p_value if test else None,
                                      mark=test.mark if test else ""))
    return scores


def length_bucket_table(scores: Sequence[BucketScore], *, tested: bool = False) -> Table:
    """``tested``: the scores were computed against a baseline (columns delta, p and sig)."""
    if not tested:
        return Table(("system", "bucket", "sentences", "bleu"),
                     tuple((s.system, s.bucket, s.count, s.bleu) for s in scores))
    return Table(("system", "bucket", "sentences", "bleu", "delta", "p", "sig"),
                 tuple((s.system, s.bucket, s.count, s.bleu, s.delta, s.p_value, s.mark) for s in scores),
                 p_columns=("p",))


# ----------------------------------------------------------------------------- every run against every baseline run
@dataclass(frozen=True)
class PairedResult:
    """One system tested against one baseline run on the same sentences (sacreBLEU's paired bootstrap)."""

    system: str
    baseline: str
    bleu: float           # the system's corpus BLEU
    baseline_bleu: float
    delta: float          # bleu - baseline_bleu
    p_value: float
    mark: str             # ⇑ ↑ ↓ ⇓ as in the comparison tables


def pairwise_tests(systems: Mapping[str, Sequence[str]], references: References, *, baselines: Sequence[str],
                   tokenize: str = "13a", n_samples: int = 1000, seed: int = 12345) -> list[PairedResult]:
    """Every system against every baseline (never against itself), system-major.

    Why: with one training run a side, a variant's mark can depend on which seed of the baseline it meets;
    testing it against each baseline seed shows whether it does."""
    missing = [b for b in baselines if b not in systems]
    if missing:
        raise KeyError(f"baseline {missing[0]!r} is not one of the systems ({', '.join(systems)})")
    results = []
    for name, hyps in systems.items():
        for base in baselines:
            if base == name:
                continue
            test = paired_bootstrap_bleu(systems[base], hyps, references, n_samples=n_samples, seed=seed,
                                         tokenize=tokenize)
            results.append(PairedResult(system=name, baseline=base, bleu=test.system.score,
                                        baseline_bleu=test.baseline.score, delta=test.delta, p_value=test.p_value,
                                        mark=test.mark))
    return results


def pairwise_tables(results: Sequence[PairedResult], scores: Mapping[str, float], *,
                    baselines: Sequence[str]) -> tuple[Table, Table]:
    """(wide table for reading, long table for the CSV). ``scores``: every system's corpus BLEU, in row order.

    The wide table has one row per system and one column per baseline ("+1.05 ↑ (p = 0.014)"; blank: a run
    against itself); with more than one baseline, a last column gives the difference to the baselines' mean
    BLEU (untested: a mean of runs is no system to resample; a baseline's own row includes itself in it)."""
    by = {(r.system, r.baseline): r for r in results}
    mean = sum(scores[b] for b in baselines) / len(baselines)
    with_mean = len(baselines) > 1

    def cell(system: str, base: str) -> str:
        r = by.get((system, base))
        return "" if r is None else f"{r.delta:+.2f}{' ' + r.mark if r.mark else ''} (p = {p_text(r.p_value)})"

    mean_column = ("vs mean of baselines",) if with_mean else ()
    wide_rows = tuple((s, bleu, *(cell(s, b) for b in baselines), *((f"{bleu - mean:+.2f}",) if with_mean else ()))
                      for s, bleu in scores.items())
    wide = Table(("system", "bleu", *(f"vs {b}" for b in baselines), *mean_column), wide_rows)
    long_rows = [(r.system, r.baseline, r.bleu, r.baseline_bleu, r.delta, r.p_value, r.mark) for r in results]
    if with_mean:
        long_rows += [(s, "mean of baselines", bleu, mean, bleu - mean, None, "") for s, bleu in scores.items()]
    return wide, Table(("system", "baseline", "bleu", "baseline_bleu", "delta", "p", "sig"), tuple(long_rows),
                       p_columns=("p",))


# ----------------------------------------------------------------------------- sweeps (CSAN Fig. 2)
def dotted_value(tree: Any, key: str) -> Any:
    """``tree`` followed by a dotted key: names index mappings and attributes of config objects (their
    properties too, e.g. a window part's ``window_size``), integers index lists
    (``model.encoder.attention.parts.0.size``). A missing step is an error naming what exists there."""
    node, walked = tree, []
    for step in key.split("."):
        if isinstance(node, BaseModel):  # a validated config section
            if not hasattr(node, step):
                where, keys = ".".join(walked) or "<root>", ", ".join(type(node).model_fields)
                raise KeyError(f"{where} has no key {step!r} (keys: {keys})")
            node = getattr(node, step)
        elif isinstance(node, Mapping):
            if step not in node:
                where, keys = ".".join(walked) or "<root>", ", ".join(map(str, node))
                raise KeyError(f"{where} has no key {step!r} (keys: {keys})")
            node = node[step]
        elif isinstance(node, (list, tuple)):
            if not step.lstrip("-").isdigit() or not -len(node) <= int(step) < len(node):
                raise KeyError(f"{'.'.join(walked)} is a list of {len(node)} items; {step!r} is not an index in it")
            node = node[int(step)]
        else:
            raise KeyError(f"{'.'.join(walked)} is a value ({node!r}), not a section; cannot look up {step!r}")
        walked.append(step)
    return node


@dataclass(frozen=True)
class SweepPoint:
    run: str
    value: Any       # the swept setting read from the run's config
    score: float
    source: str = ""  # where the score came from, e.g. "valid bleu, step 3000"


def best_validation(records: Sequence[Mapping], *, metric: str, split: str = "valid") -> tuple[int, float]:
    """(step, score) of the best ``split`` record for ``metric`` (max; min for loss/ppl)."""
    curve = learning_curve(records, metric=metric, split=split)
    pick = min if metric in LOWER_IS_BETTER else max
    return pick(curve, key=lambda point: point[1])


def _sort_key(value: Any) -> tuple:
    """Numbers first, by value; then anything else by its text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def sweep_means(points: Sequence[SweepPoint]) -> list[tuple[Any, float, int]]:
    """(value, mean score, number of runs) per swept value, ordered by value (seeds are averaged)."""
    groups: dict[str, tuple[Any, list[float]]] = {}
    for p in points:
        groups.setdefault(repr(p.value), (p.value, []))[1].append(p.score)
    ordered = sorted(groups.values(), key=lambda g: _sort_key(g[0]))
    return [(value, sum(scores) / len(scores), len(scores)) for value, scores in ordered]


def sweep_table(points: Sequence[SweepPoint], *, key: str) -> Table:
    ordered = sorted(points, key=lambda p: (_sort_key(p.value), p.run))
    return Table(("run", key, "score", "from"), tuple((p.run, p.value, p.score, p.source) for p in ordered))


# ----------------------------------------------------------------------------- learning curves (Dufter Fig. 2)
def learning_curve(records: Sequence[Mapping], *, metric: str, split: str = "valid") -> list[tuple[int, float]]:
    """(step, value) of ``metric`` in the ``split`` records of a ``metrics.jsonl``, by step.

    A resumed run may log a step twice (validated again after the restart); the later record wins.
    """
    chosen = [r for r in records if r.get("split") == split]
    if not records:
        raise KeyError("no records at all (has the run been trained and validated yet?)")
    if not chosen:
        splits = sorted({str(r.get("split")) for r in records})
        raise KeyError(f"no {split!r} records (splits present: {', '.join(splits) or 'none'})")
    with_metric = {int(r["step"]): float(r[metric]) for r in chosen if metric in r}
    if not with_metric:
        names = sorted({k for r in chosen for k in r} - {"split", "step", "time"})
        raise KeyError(f"no {split!r} record has metric {metric!r} (metrics: {', '.join(names)})")
    return sorted(with_metric.items())


def metric_names(records: Sequence[Mapping], *, pattern: str, split: str = "valid") -> list[str]:
    """The metrics of the ``split`` records that match the shell-style ``pattern`` (``*gamma_q*``), sorted;
    a pattern without wildcards names one metric (checked by ``learning_curve``)."""
    if not any(c in pattern for c in "*?["):
        return [pattern]
    names = sorted({k for r in records if r.get("split") == split for k in r} - {"split", "step", "time"})
    matched = fnmatch.filter(names, pattern)
    if not matched:
        raise KeyError(f"no {split!r} metric matches {pattern!r} (metrics: {', '.join(names) or 'none'})")
    return matched


def mean_curves(curves: Mapping[str, Sequence[tuple[int, float]]],
                group_of: Mapping[str, str]) -> dict[str, list[tuple[int, float]]]:
    """One curve per group (e.g. the seeds of one variant): the mean at each step that every member
    logged, so no point mixes a different number of runs; a run stopped early ends its group there.
    Keys are ``"<group> (mean of n)"``."""
    members: dict[str, list[dict[int, float]]] = {}
    for name, points in curves.items():
        members.setdefault(group_of[name], []).append(dict(points))
    means = {}
    for group, runs in members.items():
        steps = sorted(set.intersection(*(set(run) for run in runs)))
        if not steps:
            raise ValueError(f"the runs of {group!r} have no validation step in common")
        means[f"{group} (mean of {len(runs)})"] = [(s, sum(run[s] for run in runs) / len(runs)) for s in steps]
    return means


def curves_table(curves: Mapping[str, Sequence[tuple[int, float]]]) -> Table:
    """Wide table: one row per step (union over runs), one column per run; blank where not logged."""
    by_run = {name: dict(points) for name, points in curves.items()}
    steps = sorted({s for points in by_run.values() for s in points})
    return Table(("step", *curves), tuple((s, *(by_run[name].get(s) for name in curves)) for s in steps), digits=3)


# ----------------------------------------------------------------------------- gates (MUSE Fig. 4)
@dataclass(frozen=True)
class GateRow:
    stack: str                   # "encoder" / "decoder" (or the module name if it is neither)
    layer: int                   # 0-based layer index, as in the config's ``layers`` lists
    kernels: tuple[int, ...]     # kernel size of each convolution cell
    weights: tuple[float, ...]   # g = softmax(alpha), one per cell; sums to 1


_LAYER_NAME = re.compile(r"(?:^|\.)(encoder|decoder)\.layers\.(\d+)(?:\.|$)")


def layer_of(module_name: str) -> tuple[str, int]:
    """("encoder", 2) for ``encoder.layers.2.mixer.mixer``; (module_name, -1) if it names no stack layer."""
    match = _LAYER_NAME.search(module_name)
    return (match.group(1), int(match.group(2))) if match else (module_name, -1)


def gate_rows(gates: Mapping[str, Sequence[float]], kernels: Mapping[str, Sequence[int]]) -> list[GateRow]:
    """One row per MUSE layer, encoder before decoder, by depth."""
    rows = []
    for name, weights in gates.items():
        weights = [float(w) for w in weights]
        if len(kernels[name]) != len(weights):
            raise ValueError(f"{name}: {len(weights)} gate weights for kernel sizes {list(kernels[name])}")
        stack, layer = layer_of(name)
        rows.append(GateRow(stack, layer, tuple(int(k) for k in kernels[name]), tuple(weights)))
    return sorted(rows, key=lambda r: ({"encoder": 0, "decoder": 1}.get(r.stack, 2), r.stack, r.layer))


def small_to_large(row: GateRow) -> float | None:
    """g of the layer's smallest kernel over g of its largest: the quantity MUSE Fig. 4 plots per layer."""
    if len(set(row.kernels)) < 2:
        return None
    by_size = dict(zip(row.kernels, row.weights))
    return by_size[min(by_size)] / by_size[max(by_size)]


def gate_table(rows: Sequence[GateRow]) -> Table:
    """stack x layer rows, one ``k=<size>`` column per kernel size (blank where a layer lacks it) and
    the small/large ratio of MUSE Fig. 4 (blank for a single-kernel layer)."""
    sizes = sorted({k for r in rows for k in r.kernels})
    cells = [(r.stack, r.layer, *(dict(zip(r.kernels, r.weights)).get(k) for k in sizes), small_to_large(r))
             for r in rows]
    return Table(("stack", "layer", *(f"k={k}" for k in sizes), "small/large"), tuple(cells), digits=3)


# ----------------------------------------------------------------------------- attention maps
TRACE_STAGES = ("final", "weights", "weights_final", "scores")


def trace_stage(trace: Mapping[str, Any] | None, stage: str = "final") -> str:
    """The trace key ``stage`` names: ``weights`` (softmax), ``weights_final`` (after post-softmax
    parts), ``scores`` (pre-softmax), or ``final`` = what the values were multiplied with
    (``weights_final`` if the layer has post-softmax parts, else ``weights``)."""
    if stage not in TRACE_STAGES:
        raise ValueError(f"unknown trace stage {stage!r}; choose one of {TRACE_STAGES}")
    if not trace or "weights" not in trace:
        raise KeyError(f"this layer recorded no token-to-token weights (trace keys: {sorted(trace or {})}); "
                       "its mixer has no such map (the block mixer attends over block summaries)")
    name = ("weights_final" if "weights_final" in trace else "weights") if stage == "final" else stage
    if name not in trace:
        raise KeyError(f"this layer's trace has no {name!r} (keys: {sorted(trace)}); {name!r} exists only "
                       "when the layer has post-softmax parts")
    return name


def attention_matrix(trace: Mapping[str, Any] | None, *, head: int | None, stage: str = "final",
                     batch: int = 0) -> np.ndarray:
    """One head's [i, j] matrix (``head`` None: the mean over heads) of a layer's trace at ``stage``
    (see ``trace_stage``)."""
    cube = np.asarray(trace[trace_stage(trace, stage)][batch], dtype=np.float64)  # [h, i, j]
    if head is None:
        return cube.mean(axis=0)  # [i, j]
    if not 0 <= head < cube.shape[0]:
        raise IndexError(f"head {head} does not exist; this layer has {cube.shape[0]} heads (0..{cube.shape[0] - 1})")
    return cube[head]  # [i, j]


def key_blocks(matrix: np.ndarray, *, keys: int) -> list[tuple[int, np.ndarray]]:
    """Cut an [i, n*j] matrix whose key axis repeats ``keys`` = j tokens n times (2D-CSAN's
    ``extend``: blocks for head offsets -n//2 .. n//2, in order) into (offset, [i, j]) blocks.
    An ordinary [i, j] matrix is one block with offset 0."""
    width = matrix.shape[-1]
    if keys <= 0 or width % keys:
        raise ValueError(f"the key axis has {width} columns, not a multiple of the {keys} key tokens")
    n = width // keys
    return [(delta - n // 2, matrix[:, delta * keys:(delta + 1) * keys]) for delta in range(n)]


def split_decoder_traces(traces: Sequence[Mapping | None], *, has_cross: Sequence[bool]
                         ) -> list[tuple[Mapping | None, Mapping | None]]:
    """(self trace, cross trace) per decoder layer from the flat list a decoder forward appends to.

    A layer appends its self-mixer's trace, then its cross-attention's if it has a separate one
    (``has_cross``); a MUSE block with a parallel cross branch puts that one under ``cross_*`` keys.
    """
    if len(traces) != len(has_cross) + sum(has_cross):
        raise ValueError(f"{len(traces)} traces do not fit {len(has_cross)} decoder layers "
                         f"({sum(has_cross)} with a separate cross-attention)")
    out, it = [], iter(traces)
    for cross in has_cross:
        own = next(it)
        if cross:
            out.append((own, next(it)))
            continue
        inner = {k[len("cross_"):]: v for k, v in (own or {}).items() if k.startswith("cross_")}
        out.append((own, inner or None))
    return out
