"""The analyses of a trained model's internals: the MUSE kernel-gate weights per layer (MUSE Fig. 4, Eq. 7)
and attention maps from ``Attention`` traces (a stage, one head or the mean, 2D-CSAN key blocks, and the
decoder's flat trace list split into self and cross traces per layer).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sanlab.evaluation.analysis_table import Table


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
    by_size = weights_by_size(row)
    return by_size[min(by_size)] / by_size[max(by_size)]


def weights_by_size(row: GateRow) -> dict[int, float]:
    """The gate weight on each kernel size: summed over branches of one size (a config may repeat a size), so
    a layer's weights still sum to 1 and none is lost."""
    by_size: dict[int, float] = {}
    for k, w in zip(row.kernels, row.weights):
        by_size[k] = by_size.get(k, 0.0) + w
    return by_size


def gate_table(rows: Sequence[GateRow]) -> Table:
    """stack x layer rows, one ``k=<size>`` column per kernel size (blank where a layer lacks it; branches of
    one size summed) and
    the small/large ratio of MUSE Fig. 4 (blank for a single-kernel layer)."""
    sizes = sorted({k for r in rows for k in r.kernels})
    cells = [(r.stack, r.layer, *(weights_by_size(r).get(k) for k in sizes), small_to_large(r))
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
        why = ("the layer computes no pre-softmax scores (a convolution's weights are its own)" if name == "scores"
               else f"{name!r} exists only when the layer has post-softmax parts")
        raise KeyError(f"this layer's trace has no {name!r} (keys: {sorted(trace)}); {why}")
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
