"""CNNs baseline: QANet convolution sublayers inserted before the self-attention sublayer (spec B.6).

Yu, Dohan, Luong, Zhao, Chen, Norouzi & Le, "QANet: Combining Local Convolution with Global
Self-Attention for Reading Comprehension", ICLR 2018, https://arxiv.org/abs/1804.09541, Sec. 2.2
(encoder block: [conv x n_conv] -> self-attention -> feed-forward, each sublayer residual):

    x <- x + Dropout(ReLU(PW(DW_k(LN(x)))))      n_conv = 4 times, k = 7 (pre-norm host)

DW_k is a depthwise convolution (one width-k kernel per channel, no bias), PW a pointwise d -> d
linear map; ``conv_type: full`` uses one dense width-k convolution instead. The residual and the
normalisation follow the host (``layers.transformer.Residual``). The input of every convolution is
multiplied by the token-valid mask, so padding cannot leak into the last real tokens. Same padding
in the encoder; causal (left-only, k-1) padding when built for a causal side.

A pre-block is a module called ``block(x, positions=positions)`` inside ``EncoderLayer``; its config is in
``conv_blocks_config.py``, its registry (``PRE_BLOCKS``, read by ``StackConfig.pre_blocks``) in ``pre_blocks.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sanlab.attention.positions import Positions
from sanlab.layers.conv_blocks_config import ConvBlockConfig
from sanlab.layers.transformer import Residual
from sanlab.registry import BuildContext


class SeparableConv(nn.Module):
    """Depthwise width-k convolution (no bias) then a pointwise d -> d linear map: [b, i, d] -> [b, i, d]."""

    def __init__(self, *, dim: int, kernel: int):
        super().__init__()
        self.depthwise = nn.Conv1d(dim, dim, kernel, groups=dim, bias=False)
        self.pointwise = nn.Linear(dim, dim)

    def forward(self, x_padded: Tensor) -> Tensor:
        return self.pointwise(self.depthwise(x_padded).transpose(1, 2))  # [b, i, d]


class FullConv(nn.Module):
    """One dense width-k convolution d -> d: [b, d, i + k - 1] -> [b, i, d]."""

    def __init__(self, *, dim: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, kernel)

    def forward(self, x_padded: Tensor) -> Tensor:
        return self.conv(x_padded).transpose(1, 2)  # [b, i, d]


CONVS = {"separable": SeparableConv, "full": FullConv}


class QANetConvBlock(nn.Module):
    """``count`` residual sublayers ReLU(conv(mask * x)) with the host's norm placement and dropout."""

    def __init__(self, *, dim: int, count: int, kernel: int, conv_type: str, norm: str, dropout: float,
                 causal: bool = False):
        super().__init__()
        if conv_type not in CONVS:
            raise ValueError(f"unknown conv_type {conv_type!r}; choose one of {sorted(CONVS)}")
        if not causal and kernel % 2 == 0:
            raise ValueError(f"same padding needs an odd kernel width, got {kernel}")
        self.convs = nn.ModuleList(CONVS[conv_type](dim=dim, kernel=kernel) for _ in range(count))
        self.residuals = nn.ModuleList(Residual(dim=dim, norm=norm, dropout=dropout) for _ in range(count))
        # causal: the output at i sees inputs i-k+1 .. i; same: i-(k-1)/2 .. i+(k-1)/2
        self.padding = (kernel - 1, 0) if causal else (kernel // 2, kernel // 2)

    def _conv(self, conv: nn.Module, x: Tensor, positions: Positions) -> Tensor:
        if positions.query_valid is not None:  # [b, i]: the tokens of x (the keys of its self-attention)
            x = x * positions.query_mask(x.dtype)  # padded tokens contribute zeros
        x_padded = F.pad(x.transpose(1, 2), self.padding)  # [b, d, i + k - 1]
        return torch.relu(conv(x_padded))  # [b, i, d]

    def forward(self, x: Tensor, *, positions: Positions) -> Tensor:
        for conv, residual in zip(self.convs, self.residuals):
            x = residual(x, lambda h, conv=conv: self._conv(conv, h, positions))
        return x


def build_conv_block(config: ConvBlockConfig, ctx: BuildContext, *, norm: str, dropout: float) -> QANetConvBlock:
    return QANetConvBlock(dim=ctx.dim, count=config.count, kernel=config.kernel, conv_type=config.conv_type,
                     norm=norm, dropout=dropout, causal=ctx.causal)

