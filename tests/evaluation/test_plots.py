"""Layout of the analysis figures: what a reader must be able to see is not covered by anything else."""

from __future__ import annotations

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg

from sanlab.evaluation.plots import grouped_bars_figure


def test_grouped_bars_legend_sits_beside_the_bars_not_on_them():
    # six series of tall, even bars (a length-bucket plot): no free corner inside the axes is left for a legend
    series = {f"system-{n}": [40.0 + n % 3, 41.0, 39.0, 37.0, 33.0] for n in range(6)}
    fig = grouped_bars_figure(groups=["1-8", "9-10", "11-12", "13-15", ">15"], series=series, title="t",
                              xlabel="x", ylabel="BLEU")
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    (ax,), (legend,) = fig.axes, fig.legends
    assert [t.get_text() for t in legend.get_texts()] == list(series)
    legend_box, axes_box = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend_box.x0 >= axes_box.x1  # entirely to the right of the plotting area
    assert 0 <= legend_box.x0 and legend_box.x1 <= fig.bbox.x1  # and still inside the saved figure


def test_grouped_bars_leave_nan_bars_out_and_keep_every_group():
    fig = grouped_bars_figure(groups=["a", "b", "c"], series={"s": [1.0, float("nan"), 2.0]}, title="t", xlabel="x",
                              ylabel="y", hline=0.0)
    (ax,) = fig.axes
    heights = [p.get_height() for p in ax.patches]
    assert heights[0] == 1.0 and np.isnan(heights[1]) and heights[2] == 2.0
    assert ax.get_xlim() == (-0.5, 2.5)


def test_grouped_bars_without_series_draw_no_empty_legend(recwarn):
    # `analyze ngram-gap RUN --baseline RUN`: the baseline's own precisions are the table; no system has a gap to
    # plot, and matplotlib warned on the terminal about a legend with nothing in it
    fig = grouped_bars_figure(groups=["1-gram", "2-gram"], series={}, title="t", xlabel="x", ylabel="y", hline=0.0)
    assert fig.legends == [] and not [w for w in recwarn if "legend" in str(w.message)]
