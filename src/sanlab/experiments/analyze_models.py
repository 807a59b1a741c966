"""The ``sanlab analyze`` entry points that load a trained model: ``gates`` (MUSE Fig. 4, the kernel-gate
weights of every MUSE layer) and ``attention_map`` (one layer/head on one sentence, one block per head
offset for 2D-CSAN).
"""

from __future__ import annotations

import math
from pathlib import Path

from sanlab.errors import ConfigError
from sanlab.experiments.analyze_inputs import PathLike, checked, run_labels, write_outputs

SIDE_NAMES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
              "cross": "decoder cross-attention"}


def gates(run_dir: PathLike, *, out: PathLike, checkpoint: str = "best", device: str = "cpu") -> dict[str, Path]:
    """Gate weight g = softmax(alpha) of each MUSE convolution kernel in every layer (MUSE Fig. 4), the model
    loaded on ``device``."""
    from sanlab.evaluation import analysis_internals, plots
    from sanlab.layers.muse import gate_weights
    from sanlab.runs import load_trained

    _, model, _ = load_trained(Path(run_dir), checkpoint=checkpoint, device=device)
    weights = gate_weights(model)
    if not weights:
        raise ConfigError(f"{run_dir}: no MUSE layer with convolution cells (mixer type 'muse') in this model")
    kernels = {name: [cell.kernel_size for cell in model.get_submodule(name).cells] for name in weights}
    rows = analysis_internals.gate_rows({n: w.tolist() for n, w in weights.items()}, kernels)
    layers = sorted({r.layer for r in rows})
    def ratio(stack: str, layer: int) -> float:
        row = next((r for r in rows if r.stack == stack and r.layer == layer), None)
        value = analysis_internals.small_to_large(row) if row is not None else None
        return math.nan if value is None else value  # no bar: no such layer, or a single kernel

    ratios = {stack: [ratio(stack, n) for n in layers] for stack in dict.fromkeys(r.stack for r in rows)}
    notes = (f"Checkpoint `{checkpoint}` of `{run_labels([run_dir])[0]}`. g = softmax(alpha) over the cells of a "
             "layer (MUSE Eq. 7; 1/n at initialisation); layers are 0-based, as in the config's `layers` lists. "
             "small/large = g of the layer's smallest kernel over g of its largest, the bars of MUSE Fig. 4 "
             "(above 1: the layer leans on the small kernel); the plot draws it per layer and stack.")
    return write_outputs(out, title="MUSE kernel gates per layer", table=analysis_internals.gate_table(rows),
                         notes=notes,
                         plot=lambda png: plots.grouped_bars(
                             png, groups=[f"layer {n}" for n in layers], series=ratios, hline=1.0,
                             title="MUSE: small-kernel over large-kernel gate weight per layer",
                             xlabel="layer (0-based)", ylabel="g(smallest k) / g(largest k)"))


def attention_map(run_dir: PathLike, *, out: PathLike, sentence: str, side: str = "encoder", layer: int = 0,
                  head: int | None = 0, target: str | None = None, stage: str = "final",
                  checkpoint: str = "best", device: str = "cpu") -> dict[str, Path]:
    """Heat map of one layer/head (``head`` None: mean over heads) of a trained model on ``sentence``, the
    model loaded on ``device``."""
    from sanlab.evaluation import analysis_internals, analysis_table, plots
    from sanlab.experiments.attention_traces import layer_trace

    found = layer_trace(Path(run_dir), sentence=sentence, side=side, layer=layer, target=target,
                        checkpoint=checkpoint, device=device)
    where = f"{SIDE_NAMES.get(side, side)}, layer {layer}"
    stage = checked(analysis_internals.trace_stage, found.trace, stage, context=where)
    matrix = checked(analysis_internals.attention_matrix, found.trace, head=head, stage=stage, context=where)
    blocks = checked(analysis_internals.key_blocks, matrix, keys=len(found.keys), context=where)
    many = len(blocks) > 1
    columns = [f"{delta:+d}:{tok}" if many else tok for delta, _ in blocks for tok in found.keys]
    rows = tuple((q, *(float(x) for _, b in blocks for x in b[i])) for i, q in enumerate(found.queries))
    table = analysis_table.Table(("query", *columns), rows, digits=3)
    head_text = "mean over heads" if head is None else f"head {head}"
    title = f"{run_labels([run_dir])[0]}: {where}, {head_text} ({stage})"
    notes = (f"Checkpoint `{checkpoint}`. Rows: queries, columns: keys." + (f" Target: `{found.target}`." if
             found.target is not None else "") + (" The key axis holds one block per neighbouring head "
                                                 "(2D-CSAN), labelled by head offset delta (keys of head "
                                                 "(h + delta) mod H with the default wrap boundary)." if many else ""))
    return write_outputs(out, title=title, table=table, notes=notes, plot=lambda png: plots.heatmap(
        png, blocks=[(f"head offset {d:+d}" if many else "", b) for d, b in blocks], x_labels=found.keys,
        y_labels=found.queries, title=title, colorbar_label="score" if stage == "scores" else "attention weight"))
