"""MUSE: parallel multi-scale attention (attention + dynamic convolutions + FFN in one block).

Zhao, Sun, Xu, Zhang & Luo 2019, "MUSE: Parallel Multi-Scale Attention for Sequence to Sequence
Learning", https://arxiv.org/abs/1911.09483 (ICLR-2020 text Eq. 1, 4-8), following the official
code (lancopku/MUSE, ``ParallelMultiheadAttention``) where the text is silent (``docs/spec/muse.md``):

    V    = X~ W^V + b^V                                     X~ = Dropout_in(X), shared by attention and convs
    D    = sum_i g_i DynConv_{k_i}(V),  g = softmax(alpha)  Eq. 6-7, alpha_i = 1/n at init, k = {3, 15}
    Y_ac = [Z ; D] W^O + b^O                                Z = attention heads; one fused 2d -> d projection
    X'   = LN(X + Dropout(Y_ac) [+ Dropout(CrossAttn(X, enc))] + Dropout(FFN(X)))   Eq. 1, 8

MUSE_FF (MUSE-simple) is the same block without the convolutions (d -> d attention output).
``ParallelBlock`` is the one-residual sum of branches; the layer adds X and the LayerNorm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from sanlab.attention.build import build_attention
from sanlab.attention.config import AttentionConfig
from sanlab.attention.core import Attention, AttentionOutput
from sanlab.attention.positions import Positions
from sanlab.layers.dynamic_conv import ConvState, DynamicConv, PredictedKernels
from sanlab.layers.muse_config import MuseConfig, MuseFFConfig
from sanlab.registry import BuildContext


@dataclass(frozen=True)
class MultiScaleState:
    """Decoding state of ``MultiScaleAttention``: the attention cache and one ``ConvState`` per cell."""

    attention: Any = None
    convs: tuple[ConvState, ...] = ()


class MultiScaleAttention(nn.Module):
    """Attention and dynamic-convolution cells on one value projection, gated, with one fused output
    projection: Y_ac = [Z ; sum_i g_i DynConv_{k_i}(V)] W^O + b^O.

    ``values`` is the value projection W^V, b^V, the module the ``attention`` was built with as its
    ``v_proj`` (``build_muse`` passes the same instance to both); it is registered under the attention, so
    its parameters are listed once, as ``attention.v_proj``. ``attention`` must be built without an output
    projection. ``mask_padding`` zeroes V at padded positions before the convolutions (the released runs
    did not; see ``MuseConfig.conv_mask_padding``).
    """

    def __init__(self, *, attention: Attention, values: nn.Module, cells: list[DynamicConv],
                 mask_padding: bool = True):
        super().__init__()
        if not isinstance(attention.out_proj, nn.Identity):
            raise ValueError("MultiScaleAttention fuses the output projection; build its attention with out_proj=False")
        if not cells:
            raise ValueError("MultiScaleAttention needs at least one convolution cell (without cells use MUSE_FF)")
        if attention.parts_in("project"):  # e.g. temperature's gamma_v would scale the attention's V only
            names = ", ".join(type(part).__name__ for part in attention.parts_in("project"))
            raise ValueError(f"MUSE's convolutions read the shared value projection directly, so attention parts "
                             f"that rescale the projections ({names}) would reach only the attention branch; "
                             "use them with MUSE_FF or plain attention")
        self.attention, self.cells, self.mask_padding = attention, nn.ModuleList(cells), mask_padding
        self.__dict__["values"] = values  # not a submodule of this one: its state_dict keys stay attention.v_proj.*
        self.gate = nn.Parameter(torch.full((len(cells),), 1.0 / len(cells)))  # alpha, Eq. 7
        self.out_proj = nn.Linear(2 * attention.dim, attention.dim)  # W^O over [Z ; D]

    def gate_weights(self) -> Tensor:
        """g = softmax(alpha) [n], one weight per cell (ICLR Figure 4 plots these per layer)."""
        return torch.softmax(self.gate, dim=0)

    def convolve(self, x: Tensor, *, positions: Positions, states: tuple[ConvState, ...] = (),
                 use_cache: bool = False) -> tuple[Tensor, tuple]:
        """D = sum_i g_i DynConv_{k_i}(V) [b, i, h*d] and the cells' new states."""
        v = self.values(x)  # [b, i, h*d]
        if self.mask_padding and positions.query_valid is not None:
            v = v * positions.query_mask(v.dtype)
        gate = self.gate_weights()
        out, new_states = torch.zeros_like(v), []
        for n, cell in enumerate(self.cells):
            y, state = cell(v, state=states[n] if states else None, use_cache=use_cache)  # [b, i, h*d]
            out = out + gate[n] * y
            new_states.append(state)
        return out, tuple(new_states)

    def forward(self, x: Tensor, *, positions: Positions, cache: MultiScaleState | None = None,
                use_cache: bool = False, need_trace: bool = False) -> AttentionOutput:
        cache = cache or MultiScaleState()
        att = self.attention(x, positions=positions, cache=cache.attention, use_cache=use_cache,
                             need_trace=need_trace)  # Z [b, i, h*d]
        conv, conv_states = self.convolve(x, positions=positions, states=cache.convs, use_cache=use_cache)
        out = self.out_proj(torch.cat([att.output, conv], dim=-1))  # [b, i, h*d]
        trace = None
        if need_trace:
            trace = {**(att.trace or {}), "gate": self.gate_weights().detach()}
        return AttentionOutput(out, MultiScaleState(att.cache, conv_states) if use_cache else None, trace)


@dataclass(frozen=True)
class ParallelState:
    """Decoding state of ``ParallelBlock``: its mixer's cache and its cross-attention's."""

    mixer: Any = None
    cross: Any = None


class ParallelBlock(nn.Module):
    """Branches that all read the layer input and are summed, each after its own dropout:

        mixer(Dropout_in(x)) [+ CrossAttn(x, memory)] [+ FFN(x)]

    It fills the mixer slot of a parallel layer (``layers.transformer``), which adds the one residual and
    LayerNorm and no dropout of its own, since the block ``drops_branches``; with a cross-attention branch
    the layer passes it ``memory=`` and ``cross_positions=``. ``reference_only`` is a module the reference
    code builds but never calls, kept only so parameter counts match its logs (it receives no gradient).
    """

    drops_branches = True  # what a parallel layer relies on: each branch output has its own dropout

    def __init__(self, *, mixer: nn.Module, ffn: nn.Module | None = None, cross_attention: nn.Module | None = None,
                 dropout: float = 0.0, input_dropout: float = 0.0, reference_only: nn.Module | None = None):
        super().__init__()
        self.mixer, self.ffn, self.cross_attention = mixer, ffn, cross_attention
        self.dropout, self.input_dropout = nn.Dropout(dropout), nn.Dropout(input_dropout)
        self.reference_only = reference_only

    def forward(self, x: Tensor, *, positions: Positions, memory: Tensor | None = None,
                cross_positions: Positions | None = None, cache: ParallelState | None = None,
                use_cache: bool = False, need_trace: bool = False) -> AttentionOutput:
        cache = cache or ParallelState()
        mix = self.mixer(self.input_dropout(x), positions=positions, cache=cache.mixer, use_cache=use_cache,
                         need_trace=need_trace)
        y, trace, cross_cache = self.dropout(mix.output), mix.trace, None  # [b, i, h*d]
        if self.cross_attention is not None:
            if memory is None or cross_positions is None:
                raise ValueError("this block has a cross-attention branch: pass memory= and cross_positions=")
            cross = self.cross_attention(x, positions=cross_positions, memory=memory, cache=cache.cross,
                                         use_cache=use_cache, need_trace=need_trace)
            y, cross_cache = y + self.dropout(cross.output), cross.cache
            if need_trace:
                trace = {**(trace or {}), **{f"cross_{k}": v for k, v in (cross.trace or {}).items()}}
        if self.ffn is not None:
            y = y + self.dropout(self.ffn(x))
        return AttentionOutput(y, ParallelState(mix.cache, cross_cache) if use_cache else None, trace)


def reference_init(block: ParallelBlock) -> None:
    """The official code's initialisation (spec 6, ``--init_method km``): zero biases; output
    projections Kaiming-uniform with a = 1, U(+-sqrt(3/fan_in)); every other linear weight (q/k/v,
    FFN, kernel predictors) U(+-1/sqrt(fan_in)). LayerNorms, the gate and attention parts keep their own."""
    outputs = {id(m.out_proj) for m in (block.mixer, block.cross_attention) if m is not None}
    in_parts = {id(m) for a in block.modules() if isinstance(a, Attention) for m in a.parts.modules()}
    for module in block.modules():
        if not isinstance(module, nn.Linear) or id(module) in in_parts:
            continue
        fan_in = module.weight.shape[1]
        with torch.no_grad():
            if id(module) in outputs:
                nn.init.kaiming_uniform_(module.weight, a=1.0)
            else:
                module.weight.uniform_(-1.0 / math.sqrt(fan_in), 1.0 / math.sqrt(fan_in))
            if module.bias is not None:
                module.bias.zero_()


def gate_weights(model: nn.Module) -> dict[str, Tensor]:
    """Gate weights g [n] of every MUSE layer, keyed by module name (ICLR Figure 4: the weight of
    the small kernel relative to the large one over depth)."""
    return {name: m.gate_weights().detach() for name, m in model.named_modules() if isinstance(m, MultiScaleAttention)}


# ----------------------------------------------------------------------------- configs and builders
def _parallel(config: MuseFFConfig, ctx: BuildContext, mixer: nn.Module, *, ffn: nn.Module | None, dropout: float,
              cross_attention: nn.Module | None) -> ParallelBlock:
    unused = nn.LayerNorm(ctx.dim) if config.unused_cross_norm and cross_attention is not None else None
    block = ParallelBlock(mixer=mixer, ffn=ffn, cross_attention=cross_attention, dropout=dropout,
                          input_dropout=config.input_dropout, reference_only=unused)
    if config.init == "reference":
        reference_init(block)
    return block


def build_muse_ff(config: MuseFFConfig, ctx: BuildContext, *, attention: AttentionConfig, ffn: nn.Module | None = None,
                  dropout: float = 0.0, cross_attention: nn.Module | None = None) -> ParallelBlock:
    return _parallel(config, ctx, build_attention(attention.model_copy(update={"out_proj": True}), ctx), ffn=ffn,
                     dropout=dropout, cross_attention=cross_attention)


def build_muse(config: MuseConfig, ctx: BuildContext, *, attention: AttentionConfig, ffn: nn.Module | None = None,
               dropout: float = 0.0, cross_attention: nn.Module | None = None) -> ParallelBlock:
    values = nn.Linear(ctx.dim, ctx.dim, bias=attention.bias)  # W^V, shared by the attention and the cells
    attn = build_attention(attention.model_copy(update={"out_proj": False}), ctx, v_proj=values)
    cells = [DynamicConv(kernels=PredictedKernels(dim=ctx.dim, heads=attention.heads, kernel_size=k),
                         causal=ctx.causal, weight_dropout=config.weight_dropout, algorithm=config.algorithm)
             for k in config.kernel_sizes]
    mixer = MultiScaleAttention(attention=attn, values=values, cells=cells, mask_padding=config.conv_mask_padding)
    return _parallel(config, ctx, mixer, ffn=ffn, dropout=dropout, cross_attention=cross_attention)
