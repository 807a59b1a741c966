"""Token embeddings and absolute position encodings (read at explicit positions)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from sanlab.attention.positions import Positions


class TokenEmbedding(nn.Module):
    """Embedding scaled by sqrt(dim) (Vaswani et al. 2017, 3.4); N(0, dim^-1/2) init, zero pad row."""

    def __init__(self, *, vocab_size: int, dim: int, pad_id: int, scale: bool = True):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=pad_id)
        nn.init.normal_(self.embed.weight, mean=0.0, std=dim ** -0.5)
        with torch.no_grad():
            self.embed.weight[pad_id].zero_()
        self.scale = math.sqrt(dim) if scale else 1.0

    @property
    def weight(self) -> Tensor:
        return self.embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        return self.embed(tokens) * self.scale  # [b, t, dim]


class SinusoidalPositions(nn.Module):
    """sin/cos position encodings (Vaswani et al. 2017, 3.5), computed for any positions given.

    The paper's layout (sin and cos of one frequency side by side, positions from 0). fairseq puts all
    sines before all cosines, divides by dim/2 - 1 instead of dim/2 and starts at position 2: a fixed
    permutation and a slightly different set of frequencies, so its weights do not load here unchanged."""

    def __init__(self, dim: int):
        super().__init__()
        if dim % 2:
            raise ValueError(f"sinusoidal positions need an even width, got {dim}")
        inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: Tensor, *, last: int | None = None) -> Tensor:  # ``last``: as LearnedPositions
        angles = positions.to(self.inv_freq.dtype)[:, None] * self.inv_freq[None, :]  # [t, dim/2]
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # [t, dim] (interleaved)


class LearnedPositions(nn.Module):
    """A trainable table of ``max_positions`` vectors; ``size_key``: the config key that sets that size, which
    an error past the table names."""

    def __init__(self, *, max_positions: int, dim: int, init_std: float | None = None,
                 size_key: str = "model.max_positions"):
        super().__init__()
        self.size_key = size_key
        self.table = nn.Embedding(max_positions, dim)
        if init_std is None:  # Keras' uniform(-0.05, 0.05), as in Dufter et al.
            nn.init.uniform_(self.table.weight, -0.05, 0.05)
        else:
            nn.init.normal_(self.table.weight, std=init_std)
        self.max_positions = max_positions

    def forward(self, positions: Tensor, *, last: int | None = None) -> Tensor:
        """``last``: the largest of ``positions`` where the caller knows it from the layout
        (``Positions.last_positions``), so the check reads no tensor; else it is read from ``positions``."""
        if positions.numel():
            last = int(positions.max()) if last is None else last
            if last >= self.max_positions:
                raise ValueError(f"position {last} exceeds the {self.max_positions} learned positions; "
                                 f"raise {self.size_key} or filter longer sentences")
        return self.table(positions)  # [t, dim]


def position_vectors(table: nn.Module, positions: Positions) -> Tensor:
    """``table``'s vectors [i, dim] for the queries of ``positions``, the last position passed from the layout
    (``Positions.last_positions``) so that a learned table checks its range without reading the device."""
    known = positions.last_positions()
    return table(positions.q_pos, last=None if known is None else known[0])
