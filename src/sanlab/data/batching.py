"""Token-budget batching with length bucketing, a seeded per-epoch order, and exact resumption.

Examples are sorted by length and cut into batches whose padded size fits `max_tokens`, so
little compute goes to padding. Each epoch draws its randomness from a generator seeded by
`(seed, epoch)` alone: the batches of an epoch are a pure function of the lengths, the seed and
the epoch number, which is what makes resuming from `{"epoch", "position"}` exact (the trainer
keeps that position in its checkpoints, ``training.loop.Progress``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

Length = int | tuple[int, int]


def _as_pairs(lengths: Sequence[Length]) -> np.ndarray:
    """Lengths as an (N, 2) array of (source, target); a single length is used for both sides."""
    pairs = np.array([(n, n) if np.ndim(n) == 0 else tuple(n) for n in lengths], dtype=np.int64).reshape(-1, 2)
    if len(pairs) == 0:
        raise ValueError("no examples to batch (lengths is empty)")
    if (pairs < 0).any():
        raise ValueError(f"lengths must be >= 0, found {int(pairs.min())}")
    return pairs


class TokenBatchSampler:
    """Batches of example indices under a token budget.

    Cost of a batch = number of examples x the longest padded length in it, taking the maximum
    over both sides for (source, target) lengths; it never exceeds `max_tokens`, except that an
    example longer than `max_tokens` on its own becomes a one-example batch (never dropped; its
    indices are listed in `oversized` so callers can warn or filter beforehand).

    Order: examples are sorted by (source, target) length. With `shuffle=True` examples of equal
    length are first permuted, so batch contents vary between epochs, and the order of the batches
    is shuffled; both use a generator seeded by `(seed, epoch)`. With `shuffle=False` batches come
    shortest first and are the same every epoch. Usable as a DataLoader `batch_sampler`
    (`set_epoch` before iterating).
    """

    def __init__(
        self,
        lengths: Sequence[Length],
        *,
        max_tokens: int,
        max_sentences: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
    ):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences must be >= 1 or None, got {max_sentences}")
        self._pairs = _as_pairs(lengths)
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.oversized: list[int] = np.flatnonzero(self._pairs.max(axis=1) > max_tokens).tolist()
        self._sort_key = self._pairs[:, 0] * (int(self._pairs[:, 1].max()) + 1) + self._pairs[:, 1]
        self._n_batches: int | None = None

    def __len__(self) -> int:
        # Equal-length permutations do not move cut points, so every epoch has this many batches.
        if self._n_batches is None:
            self._n_batches = len(self.epoch_batches(0))
        return self._n_batches

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch that `__iter__` yields (DataLoader convention)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.epoch_batches(self.epoch))

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All batches of `epoch`, deterministic given `(seed, epoch)`."""
        order = np.arange(len(self._pairs))
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        if rng is not None:
            order = rng.permutation(order)
        # Stable sort by (source, target) length: ties keep the permuted (or index) order.
        order = order[np.argsort(self._sort_key[order], kind="stable")]
        batches = self._cut(order)
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _cut(self, order: np.ndarray) -> list[list[int]]:
        """Greedily fill batches along `order` while the padded cost stays within budget."""
        longest = self._pairs.max(axis=1)
        cap = self.max_sentences or len(order)
        batches: list[list[int]] = []
        current: list[int] = []
        current_max = 0
        for index in order.tolist():
            new_max = max(current_max, int(longest[index]))
            if current and (new_max * (len(current) + 1) > self.max_tokens or len(current) >= cap):
                batches.append(current)
                current, new_max = [], int(longest[index])
            current.append(index)
            current_max = new_max
        if current:
            batches.append(current)
        return batches


class LazyBatches(Sequence):
    """An epoch's batches, built from their example indices only when read (``batches[k]`` or a slice):
    one epoch's padded tensors are never all in memory at once, which matters at WMT scale."""

    def __init__(self, index_batches: list[list[int]], build: Callable[[list[int]], Any]):
        self.index_batches, self.build = index_batches, build

    def __len__(self) -> int:
        return len(self.index_batches)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self.build(idx) for idx in self.index_batches[k]]
        return self.build(self.index_batches[k])


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token id lists into a LongTensor (B, T), T = longest; also return lengths (B,)."""
    if len(sequences) == 0:
        raise ValueError("cannot pad an empty batch")
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)  # (B,)
    tokens = torch.full((len(sequences), int(lengths.max())), pad_id, dtype=torch.long)  # (B, T)
    for row, seq in enumerate(sequences):
        tokens[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return tokens, lengths
