"""The analyses of training records and configs: a value read from a config by dotted key, scores against a
swept setting with the mean per value (CSAN Fig. 2), the best validation record, and learning curves from
``metrics.jsonl`` records, matched by name or pattern and averaged over seeds (Dufter et al. Fig. 2).
"""

from __future__ import annotations

import fnmatch
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from sanlab.errors import case_hint
from sanlab.evaluation.analysis_table import Table

# validation metrics whose best record is the minimum, where the run's task declares no direction for them
LOWER_IS_BETTER = frozenset({"loss", "ppl"})


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


def best_validation(records: Sequence[Mapping], *, metric: str, split: str = "valid",
                    higher_is_better: bool | None = None) -> tuple[int, float]:
    """(step, score) of the best ``split`` record for ``metric``, among finite scores (a NaN first would otherwise
    win every comparison): the maximum where higher is better, as the run's task declares it (its config class's
    ``best_metrics``); None (a metric outside that table): the minimum for loss/ppl, else the maximum. Of tied
    records the newest, as ``CheckpointManager.best`` picks the run's ``best`` checkpoint: the step named is then
    that checkpoint's."""
    curve = learning_curve(records, metric=metric, split=split)
    finite = [point for point in curve if math.isfinite(point[1])]
    if not finite:
        raise ValueError(f"no {split!r} record has a finite {metric} (steps {', '.join(str(s) for s, _ in curve)})")
    if higher_is_better is None:
        higher_is_better = metric not in LOWER_IS_BETTER
    sign = 1 if higher_is_better else -1
    return max(finite, key=lambda point: (sign * point[1], point[0]))


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
    return Table(("run", key, "score", "from"), tuple((p.run, p.value, p.score, p.source) for p in ordered),
                 column_digits=((key, None),))  # the setting as the config gives it (lr 0.0005, not 0.00)


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
    with_metric = {}
    for r in chosen:
        if metric in r:
            step, value = r.get("step"), r[metric]
            if isinstance(step, bool) or not isinstance(step, int):
                raise ValueError(f"a {split!r} record has no step (a whole number): {_short(r)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"the {split!r} record of step {step} has {metric} = {value!r}, not a number")
            with_metric[step] = float(value)
    if not with_metric:
        names = sorted({k for r in chosen for k in r} - {"split", "step", "time"})
        hint = case_hint(metric, names)
        raise KeyError(f"no {split!r} record has metric {metric!r} (metrics: {', '.join(names)}){'; ' if hint else ''}"
                       f"{hint}")
    return sorted(with_metric.items())


def _short(record: Mapping) -> str:
    text = repr(dict(record))
    return text if len(text) <= 120 else text[:117] + "..."


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
    return {label: [(step, mean) for step, mean, _ in points] for label, points in seed_curves(curves, group_of).items()}


def seed_curves(curves: Mapping[str, Sequence[tuple[int, float]]],
                group_of: Mapping[str, str]) -> dict[str, list[tuple[int, float, float | None]]]:
    """``mean_curves`` with the spread of its seeds: (step, mean, sample standard deviation (n - 1), None for a
    group of one run), the seeds' sd as ``sanlab compare``'s tables give it."""
    members: dict[str, list[dict[int, float]]] = {}
    for name, points in curves.items():
        members.setdefault(group_of[name], []).append(dict(points))
    means = {}
    for group, runs in members.items():
        steps = sorted(set.intersection(*(set(run) for run in runs)))
        if not steps:
            raise ValueError(f"the runs of {group!r} have no validation step in common")
        means[f"{group} (mean of {len(runs)})"] = [
            (s, sum(values) / len(values), statistics.stdev(values) if len(values) > 1 else None)
            for s in steps for values in [[run[s] for run in runs]]]
    return means


def curves_table(curves: Mapping[str, Sequence[tuple[int, float]]],
                 spreads: Mapping[str, Sequence[tuple[int, float, float | None]]] | None = None) -> Table:
    """Wide table: one row per step (union over runs), one column per run; blank where not logged. ``spreads``
    (``seed_curves``): a ``"<line> sd"`` column for each line of two or more seeds, after all the lines' columns
    (a reader of the columns before them finds them where they were)."""
    by_run = {name: dict(points) for name, points in curves.items()}
    sds = {f"{name} sd": {s: sd for s, _, sd in points} for name, points in (spreads or {}).items()
           if any(sd is not None for _, _, sd in points)}
    steps = sorted({s for points in by_run.values() for s in points})
    return Table(("step", *curves, *sds), tuple((s, *(by_run[name].get(s) for name in curves),
                                                 *(sd.get(s) for sd in sds.values())) for s in steps), digits=3)
