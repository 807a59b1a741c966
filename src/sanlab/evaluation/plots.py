"""Rendering of the analysis figures (``sanlab analyze``): matplotlib only, no computation.

Figures are drawn on an Agg canvas directly (``matplotlib.figure.Figure``), never through pyplot,
so plotting is headless by construction and leaves no global figure state behind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 120


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)  # attaches the Agg canvas: savefig needs no display
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI, bbox_inches="tight")  # (the path may be a temporary name)
    return Path(path)


def grouped_bars(path: Path, *, groups: Sequence[str], series: Mapping[str, Sequence[float]], title: str,
                 xlabel: str, ylabel: str, hline: float | None = None) -> Path:
    """One cluster of bars per group (x), one bar colour per series; NaN bars are left out. ``hline``: a grey
    horizontal line at that value (0 for gaps, 1 for ratios)."""
    return _save(grouped_bars_figure(groups=groups, series=series, title=title, xlabel=xlabel, ylabel=ylabel,
                                     hline=hline), path)


def grouped_bars_figure(*, groups: Sequence[str], series: Mapping[str, Sequence[float]], title: str, xlabel: str,
                        ylabel: str, hline: float | None = None) -> Figure:
    fig = Figure(figsize=(max(5.0, 1.1 * len(groups) * max(1, len(series)) ** 0.5 + 2), 3.8), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(groups))
    width = 0.8 / max(1, len(series))
    for n, (name, values) in enumerate(series.items()):
        ax.bar(x + (n - (len(series) - 1) / 2) * width, np.asarray(values, dtype=float), width, label=name)
    if hline is not None:
        ax.axhline(hline, color="grey", linewidth=0.8)
    ax.set_xticks(x, list(groups))
    ax.set_xlim(-0.5, len(groups) - 0.5)  # keep every group's slot, even when all its bars are NaN
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(axis="y", alpha=0.3)
    if series:  # (none: an n-gram gap of the baseline alone; an empty legend only draws a warning)
        fig.legend(loc="outside right upper", fontsize="small")  # bars fill the axes: a legend inside hides some
    return fig


MAX_INTEGER_TICKS = 12  # up to this many distinct integer x values each get a tick (layers, window sizes)


LEGEND_INSIDE_MAX = 6  # series


def lines(path: Path, *, series: Mapping[str, tuple[Sequence, Sequence[float]]], title: str, xlabel: str,
          ylabel: str, points: Mapping[str, tuple[Sequence, Sequence[float]]] | None = None,
          reference: tuple[str, float] | None = None, styles: Mapping[str, str] | None = None,
          bands: Mapping[str, tuple[Sequence, Sequence[float], Sequence[float]]] | None = None) -> Path:
    """One line per series (x, y). Non-numeric x values become evenly spaced categories.

    ``points``: extra scatter markers (e.g. single seeds under their mean); ``reference``: a
    labelled dashed horizontal line (the baseline of CSAN Fig. 2); ``styles``: line style per series;
    ``bands``: (x, low, high) of a series, shaded in its colour around it (e.g. the seeds' spread).
    """
    fig = Figure(figsize=(6.0, 3.8), layout="constrained")
    ax = fig.add_subplot()
    xs_all = [x for xs, _ in [*series.values(), *(points or {}).values()] for x in xs]
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs_all)
    categories = list(dict.fromkeys(str(x) for x in xs_all))
    place = (lambda xs: list(xs)) if numeric else (lambda xs: [categories.index(str(x)) for x in xs])
    for name, (xs, ys) in series.items():
        (line,) = ax.plot(place(xs), ys, (styles or {}).get(name, "-"), marker="o", markersize=4, label=name)
        if name in (bands or {}):
            band_xs, low, high = bands[name]
            ax.fill_between(place(band_xs), low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    for name, (xs, ys) in (points or {}).items():
        ax.scatter(place(xs), ys, s=14, alpha=0.6, label=name)
    if reference is not None:
        ax.axhline(reference[1], color="grey", linestyle="--", linewidth=1.0, label=reference[0])
    if not numeric:
        ax.set_xticks(range(len(categories)), categories)
    elif all(isinstance(x, int) for x in xs_all) and len(set(xs_all)) <= MAX_INTEGER_TICKS:
        ax.set_xticks(sorted(set(xs_all)))
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if len(series) + len(points or {}) > LEGEND_INSIDE_MAX:  # many lines: a legend inside would cover them
        fig.set_size_inches(9.5, 3.8)
        fig.legend(loc="outside right upper", fontsize="x-small")
    else:
        ax.legend(fontsize="small")
    return _save(fig, path)


def heatmap(path: Path, *, blocks: Sequence[tuple[str, np.ndarray]], x_labels: Sequence[str],
            y_labels: Sequence[str], title: str, colorbar_label: str) -> Path:
    """Matrices side by side (one per block, sharing the query axis and one colour scale), each
    [len(y_labels), len(x_labels)], with token labels on both axes and one colour bar."""
    i, j = len(y_labels), len(x_labels)
    cell = 0.32
    fig = Figure(figsize=(min(40.0, 1.6 + len(blocks) * (cell * j + 0.6)), min(30.0, 1.8 + cell * i)),
                 layout="constrained")
    axes = fig.subplots(1, len(blocks), sharey=True, squeeze=False)[0]
    values = np.concatenate([m.ravel() for _, m in blocks])
    finite = values[np.isfinite(values)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    image = None
    for ax, (name, matrix) in zip(axes, blocks):
        image = ax.imshow(matrix, cmap="viridis", vmin=vmin, vmax=vmax, aspect="equal", interpolation="nearest")
        ax.set_xticks(range(j), list(x_labels), rotation=90, fontsize="small")
        ax.set_yticks(range(i), list(y_labels), fontsize="small")
        if name:
            ax.set_title(name, fontsize="small")
    axes[0].set_ylabel("query")
    for ax in axes:
        ax.set_xlabel("key")
    fig.suptitle(title)
    fig.colorbar(image, ax=list(axes), label=colorbar_label, shrink=min(1.0, 0.3 + 0.05 * i))
    return _save(fig, path)


def delta_grid(path: Path, *, deltas: np.ndarray, marks: Sequence[Sequence[str]], row_labels: Sequence[str],
               column_labels: Sequence[str], title: str, colorbar_label: str) -> Path:
    """A [rows, columns] matrix of differences on a diverging scale centred on 0, each cell written out with
    its mark (⇑ ↑ ↓ ⇓); NaN cells (a run against itself) are left blank."""
    rows, cols = deltas.shape
    fig = Figure(figsize=(min(30.0, 2.5 + 1.3 * cols), min(30.0, 1.2 + 0.45 * rows)), layout="constrained")
    ax = fig.subplots()
    finite = deltas[np.isfinite(deltas)]
    limit = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
    image = ax.imshow(np.ma.masked_invalid(deltas), cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto",
                      interpolation="nearest")
    for i in range(rows):
        for j in range(cols):
            if np.isfinite(deltas[i, j]):
                ax.text(j, i, f"{deltas[i, j]:+.2f} {marks[i][j]}".strip(), ha="center", va="center",
                        fontsize="small", color="white" if abs(deltas[i, j]) > 0.6 * limit else "black")
    ax.set_xticks(range(cols), list(column_labels), rotation=30, ha="right", fontsize="small")
    ax.set_yticks(range(rows), list(row_labels), fontsize="small")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label=colorbar_label)
    return _save(fig, path)
