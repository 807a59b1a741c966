"""Learnable temperature (+Temp).

Dufter, Schmitt & Schuetze, "Increasing Learning Efficiency of Self-Attention Networks through
Direct Position Interactions, Learnable Temperature, and Convoluted Attention", COLING 2020,
https://aclanthology.org/2020.coling-main.324 (no arXiv version), Sec. 2.4; spec C.6.

    q^h = gamma^h_q X W^h_Q,   k^h = gamma^h_k X W^h_K,   v^h = gamma^h_v X W^h_V

Three scalars per head and layer, initialised to 1; no normalisation is performed.
gamma_q * gamma_k acts as an inverse softmax temperature, gamma_v rescales the head's output.
A project-stage part: position-wise, so cached keys/values stay valid (incremental, causal-safe),
and the fused SDPA plan still applies.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sanlab.attention.parts.temperature_config import TemperatureConfig
from sanlab.attention.parts_base import AttentionContext, AttentionPart
from sanlab.registry import BuildContext


class LearnableTemperature(AttentionPart):
    """Scale the per-head q, k, v by learned scalars."""

    def __init__(self, *, heads: int):
        super().__init__()
        self.gamma_q = nn.Parameter(torch.ones(heads))  # [h]
        self.gamma_k = nn.Parameter(torch.ones(heads))  # [h]
        self.gamma_v = nn.Parameter(torch.ones(heads))  # [h]

    def project(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> tuple[Tensor, Tensor, Tensor]:
        def per_head(x: Tensor, gamma: Tensor) -> Tensor:
            return x * gamma[None, :, None, None].to(x.dtype)  # [b, h, i|j, d]

        return per_head(q, self.gamma_q), per_head(k, self.gamma_k), per_head(v, self.gamma_v)

    @torch.no_grad()
    def diagnostics(self) -> dict[str, float]:
        """log |gamma| over the heads, per projection: the mean, and the head farthest from 1 (signed), so a
        scale running away shows in the logs (``training.diagnostics``)."""
        report = {}
        for name, gamma in (("q", self.gamma_q), ("k", self.gamma_k), ("v", self.gamma_v)):
            log_abs = gamma.detach().abs().clamp_min(1e-30).log()  # [h]
            report[f"log_gamma_{name}_mean"] = float(log_abs.mean())
            report[f"log_gamma_{name}_extreme"] = float(log_abs[log_abs.abs().argmax()])
        return report


def build_temperature(config: TemperatureConfig, ctx: BuildContext) -> LearnableTemperature:
    return LearnableTemperature(heads=ctx.heads)
