"""Encoder and decoder layers with a mixer slot, and the one encoder and one decoder stack.

A mixer is any module called as ``mixer(x, positions=..., cache=..., use_cache=..., need_trace=...)``
returning an ``AttentionOutput`` (output, cache, trace): ``Attention``, a convolution mixer,
or a parallel mix of branches. Layers never know which.

A layer is one of two kinds, chosen by the builder (``models/builders.py``) from the mixer's config
(``MixerConfig.layer_kind``):

    sequential  [pre-blocks] -> mixer -> [cross-attention] -> [FFN], each a residual sublayer with dropout
    parallel    the mixer is a parallel block (MUSE's ``ParallelBlock``) that holds the FFN and drops out each
                of its branches itself: one residual without dropout around it. A parallel decoder layer
                built without ``cross_attention`` has the cross-attention as a branch of the block, which is
                then called with ``memory=`` and ``cross_positions=``; with one, the cross-attention
                follows as a sequential sublayer (the MUSE text's order)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from sanlab.attention.build import build_attention
from sanlab.attention.config import AttentionConfig
from sanlab.attention.positions import Positions
from sanlab.layers.mixers import AttentionMixerConfig
from sanlab.registry import BuildContext

NORM_STYLES = ("pre", "post", "none")
LAYER_KINDS = ("sequential", "parallel")


class FeedForward(nn.Module):
    """Position-wise FFN: ReLU(x W1 + b1) W2 + b2 (Vaswani et al. 2017, Eq. 2)."""

    def __init__(self, *, dim: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.w1, self.w2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.dropout(torch.relu(self.w1(x))))


class Residual(nn.Module):
    """One sublayer with its residual connection and normalisation placement.

    pre:  x + drop(f(LN(x)))      post: LN(x + drop(f(x)))
    none: x' = drop(x); x' + f(x')   (Dufter et al.'s SAN layer: no norm, dropout on the input)
    """

    def __init__(self, *, dim: int, norm: str, dropout: float):
        super().__init__()
        if norm not in NORM_STYLES:
            raise ValueError(f"unknown norm placement {norm!r}; choose one of {NORM_STYLES}")
        self.style = norm
        self.norm = nn.LayerNorm(dim) if norm != "none" else nn.Identity()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        if self.style == "pre":
            return x + self.dropout(fn(self.norm(x)))
        if self.style == "post":
            return self.norm(x + self.dropout(fn(x)))
        x = self.dropout(x)
        return x + fn(x)


def build_attention_mixer(config: AttentionMixerConfig, ctx: BuildContext, *, attention: AttentionConfig) -> nn.Module:
    """The default mixer: the stack's attention with its parts."""
    return build_attention(attention, ctx)


def _mixer_dropout(kind: str, ffn: nn.Module | None, dropout: float) -> float:
    """The dropout on the mixer's residual: none in a parallel layer, whose block drops its branches."""
    if kind not in LAYER_KINDS:
        raise ValueError(f"unknown layer kind {kind!r}; choose one of {LAYER_KINDS}")
    if kind == "parallel" and ffn is not None:
        raise ValueError("a parallel layer's FFN is a branch of its mixer; build the layer with ffn=None")
    return 0.0 if kind == "parallel" else dropout


class EncoderLayer(nn.Module):
    """[pre-blocks] -> mixer -> [FFN], each a residual sublayer (``kind`` "sequential"), or [pre-blocks] ->
    one residual around a parallel block (``kind`` "parallel")."""

    def __init__(self, *, mixer: nn.Module, ffn: nn.Module | None, dim: int, norm: str = "pre",
                 dropout: float = 0.0, pre_blocks: list[nn.Module] | None = None, kind: str = "sequential"):
        super().__init__()
        self.pre_blocks = nn.ModuleList(pre_blocks or [])  # e.g. QANet convolutions before the SAN
        self.mixer, self.ffn = mixer, ffn
        self.mixer_res = Residual(dim=dim, norm=norm, dropout=_mixer_dropout(kind, ffn, dropout))
        self.ffn_res = Residual(dim=dim, norm=norm, dropout=dropout) if ffn is not None else None

    def forward(self, x: Tensor, *, positions: Positions, traces: list | None = None) -> Tensor:
        for block in self.pre_blocks:
            x = block(x, positions=positions)

        def mix(h: Tensor) -> Tensor:
            result = self.mixer(h, positions=positions, need_trace=traces is not None)
            if traces is not None:
                traces.append(result.trace)
            return result.output

        x = self.mixer_res(x, mix)
        if self.ffn is not None:
            x = self.ffn_res(x, self.ffn)
        return x


@dataclass(frozen=True)
class DecoderLayerState:
    """Decoding state of one decoder layer: its self-mixer's cache and the cross-attention's."""

    self_cache: Any = None
    cross_cache: Any = None


class DecoderLayer(nn.Module):
    """self mixer (causal) -> [cross-attention] -> [FFN], each a residual sublayer (``kind`` "sequential").

    ``kind`` "parallel": the self mixer is a parallel block holding the FFN; without ``cross_attention`` the
    block holds the cross-attention too and receives the source (see the module docstring).
    """

    def __init__(self, *, self_mixer: nn.Module, cross_attention: nn.Module | None, ffn: nn.Module | None, dim: int,
                 norm: str = "pre", dropout: float = 0.0, kind: str = "sequential"):
        super().__init__()
        self.self_mixer, self.cross_attention, self.ffn = self_mixer, cross_attention, ffn
        self.self_res = Residual(dim=dim, norm=norm, dropout=_mixer_dropout(kind, ffn, dropout))
        self.cross_res = Residual(dim=dim, norm=norm, dropout=dropout) if cross_attention is not None else None
        self.ffn_res = Residual(dim=dim, norm=norm, dropout=dropout) if ffn is not None else None
        self.mixer_memory = kind == "parallel" and cross_attention is None  # the block's cross-attention branch

    def forward(self, x: Tensor, *, memory: Tensor, positions: Positions, cross_positions: Positions,
                state: DecoderLayerState | None = None, use_cache: bool = False,
                traces: list | None = None) -> tuple[Tensor, DecoderLayerState | None]:
        state = state or DecoderLayerState()
        caches: dict[str, Any] = {}

        def run(name: str, module: nn.Module, h: Tensor, **kw) -> Tensor:
            result = module(h, cache=getattr(state, name), use_cache=use_cache, need_trace=traces is not None, **kw)
            caches[name] = result.cache
            if traces is not None:
                traces.append(result.trace)
            return result.output

        source = dict(memory=memory, cross_positions=cross_positions) if self.mixer_memory else {}
        x = self.self_res(x, lambda h: run("self_cache", self.self_mixer, h, positions=positions, **source))
        if self.cross_attention is not None:
            x = self.cross_res(x, lambda h: run("cross_cache", self.cross_attention, h, positions=cross_positions,
                                                memory=memory))
        if self.ffn is not None:
            x = self.ffn_res(x, self.ffn)
        return x, (DecoderLayerState(**caches) if use_cache else None)


class Encoder(nn.Module):
    """A stack of encoder layers (+ final LayerNorm for pre-norm stacks)."""

    def __init__(self, layers: list[EncoderLayer], *, dim: int, final_norm: bool):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = nn.LayerNorm(dim) if final_norm else nn.Identity()

    def forward(self, x: Tensor, *, positions: Positions, traces: list | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, positions=positions, traces=traces)
        x = self.final_norm(x)
        if positions.query_valid is not None:  # padded positions are don't-care: make them exactly 0
            x = x * positions.query_mask(x.dtype)
        return x


class Decoder(nn.Module):
    """A stack of decoder layers (+ final LayerNorm for pre-norm stacks)."""

    def __init__(self, layers: list[DecoderLayer], *, dim: int, final_norm: bool):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = nn.LayerNorm(dim) if final_norm else nn.Identity()

    def forward(self, x: Tensor, *, memory: Tensor, positions: Positions, cross_positions: Positions,
                states: list[DecoderLayerState] | None = None, use_cache: bool = False,
                traces: list | None = None) -> tuple[Tensor, list[DecoderLayerState] | None]:
        new_states = []
        for n, layer in enumerate(self.layers):
            x, st = layer(x, memory=memory, positions=positions, cross_positions=cross_positions,
                          state=None if states is None else states[n], use_cache=use_cache, traces=traces)
            new_states.append(st)
        return self.final_norm(x), (new_states if use_cache else None)
