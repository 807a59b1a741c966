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


def _as_pairs(lengths: Sequence[Length] | np.ndarray) -> np.ndarray:
    """Lengths as an (N, 2) array of (source, target); a single length is used for both sides. An integer
    array of that shape is used as it is (no copy, whatever its width: a corpus of millions stays small)."""
    if isinstance(lengths, np.ndarray) and lengths.ndim == 2 and lengths.shape[1] == 2 and lengths.dtype.kind in "iu":
        pairs = lengths
    else:
        pairs = np.array([(n, n) if np.ndim(n) == 0 else tuple(n) for n in lengths], dtype=np.int64).reshape(-1, 2)
    if len(pairs) == 0:
        raise ValueError("no examples to batch (lengths is empty)")
    if pairs.dtype.kind == "i" and (pairs < 0).any():
        raise ValueError(f"lengths must be >= 0, found {int(pairs.min())}")
    return pairs


class EpochPlan(Sequence):
    """One epoch's batches as three arrays: the examples sorted by length (``order``), where each batch
    starts in it (``bounds``) and the order of the batches (``batch_order``). Batch k is an index array,
    built when read; a list of lists of the same would take gigabytes at WMT scale."""

    def __init__(self, order: np.ndarray, bounds: np.ndarray, batch_order: np.ndarray):
        self.order, self.bounds, self.batch_order = order, bounds, batch_order

    def __len__(self) -> int:
        return len(self.batch_order)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        b = int(self.batch_order[k])
        return self.order[self.bounds[b]:self.bounds[b + 1]]


def cut_points(longest: np.ndarray, *, max_tokens: int, max_sentences: int | None) -> np.ndarray:
    """Where batches start along examples of these (padded) lengths, greedily: a batch grows while
    its size x its longest example fits ``max_tokens`` and it has fewer than ``max_sentences``; an
    example over the budget alone gets a batch of its own. One numpy step per batch, not per example:
    the size x running maximum rises with the size, so the sizes that fit are a prefix."""
    n, cap = len(longest), max_sentences or len(longest)
    sizes = np.arange(1, min(cap, n, max_tokens) + 1, dtype=np.int64)
    bounds, start = [0], 0
    while start < n:
        first = int(longest[start])
        width = min(cap, n - start, max_tokens // first if first else n)
        if width > 1:
            running = np.maximum.accumulate(longest[start:start + width])
            ks = sizes[:width] if width <= len(sizes) else np.arange(1, width + 1)
            start += max(1, int(np.count_nonzero(running * ks <= max_tokens)))
        else:
            start += 1
        bounds.append(start)
    return np.asarray(bounds, dtype=np.int64)


def weighted_draw(sizes: Sequence[int], weights: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """One epoch's examples from consecutive corpora of these sizes, sampled by weight (OpenNMT-py's and
    Marian's corpus weights): as many draws as the corpora hold together, each from corpus c with
    probability weights[c] / sum(weights). A corpus's draws walk through a permutation of it, from the
    start again when it is drawn more often than it has examples, so none is repeated before all are used."""
    p = np.asarray(weights, dtype=np.float64)
    counts = rng.multinomial(int(sum(sizes)), p / p.sum())
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    index = np.int32 if sum(sizes) < 2**31 else np.int64
    return np.concatenate([(offset + np.resize(rng.permutation(size), count)).astype(index)
                           for size, count, offset in zip(sizes, counts, offsets)])


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

    `pad_multiple`: batches will be padded to a multiple of it (``pad_batch``; never past the model's
    positions), so the budget counts the rounded-up length, before that cap.

    Several corpora (`corpus_sizes`, their examples consecutive in `lengths`, with `weights`): each
    epoch first draws its examples by weight (`weighted_draw`, from the same generator), then sorts and
    cuts them as above; the number of batches may then differ a little between epochs.
    """

    def __init__(
        self,
        lengths: Sequence[Length],
        *,
        max_tokens: int,
        max_sentences: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        corpus_sizes: Sequence[int] | None = None,
        weights: Sequence[float] | None = None,
        pad_multiple: int = 1,
    ):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if pad_multiple < 1:
            raise ValueError(f"pad_multiple must be >= 1, got {pad_multiple}")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences must be >= 1 or None, got {max_sentences}")
        pairs = _as_pairs(lengths)  # not kept: the two small arrays below are all an epoch needs
        self._n = len(pairs)
        if (corpus_sizes is None) != (weights is None):
            raise ValueError("corpus_sizes and weights go together")
        if corpus_sizes is not None and (sum(corpus_sizes) != self._n or len(weights) != len(corpus_sizes)
                                         or min(weights) <= 0 or min(corpus_sizes) < 1):
            # (an empty corpus drawn by weight would hand out the next corpus's first example)
            raise ValueError(f"corpus_sizes {list(corpus_sizes)} must be positive, add up to the {self._n} "
                             f"examples and have one positive weight each, got {list(weights)}")
        self.corpus_sizes, self.weights = corpus_sizes, weights
        self.max_tokens = max_tokens
        self.max_sentences = max_sentences
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        # what the batch will be padded to, or more: the cap at the model's positions (TranslationTask.read) is not
        # counted, so the longest batches come out a little under the budget (and plans stay as they were)
        self._longest = round_up(pairs.max(axis=1), pad_multiple)
        self.oversized: list[int] = np.flatnonzero(self._longest > max_tokens).tolist()
        # (source, target) as one small integer: 16 bits, where it fits, sort by radix in linear time
        key = pairs[:, 0].astype(np.int64) * (int(pairs[:, 1].max()) + 1) + pairs[:, 1]
        self._sort_key = key.astype(np.min_scalar_type(int(key.max())))
        self._n_batches: tuple[int, int] | None = None  # (epoch, its batches), counted by __len__

    def __len__(self) -> int:
        """The batches of the epoch ``set_epoch`` chose. Of one corpus, every epoch has as many (equal-length
        permutations do not move cut points), counted once; weighted corpora draw other examples each epoch."""
        epoch = self.epoch if self.weights is not None else 0
        if self._n_batches is None or self._n_batches[0] != epoch:  # (counted once per epoch: a plan is a sort)
            self._n_batches = (epoch, len(self.epoch_plan(epoch)))
        return self._n_batches[1]

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch that `__iter__` yields (DataLoader convention)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.epoch_batches(self.epoch))

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """All batches of `epoch`, deterministic given `(seed, epoch)`."""
        return [batch.tolist() for batch in self.epoch_plan(epoch)]

    def epoch_plan(self, epoch: int) -> EpochPlan:
        """``epoch_batches`` as an ``EpochPlan``: the same batches, in the same order, as arrays."""
        n = self._n
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle or self.weights else None
        if self.weights is not None:
            order = weighted_draw(self.corpus_sizes, self.weights, rng)
        else:
            order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
        if self.shuffle:
            rng.shuffle(order)  # the permutation of rng.permutation(n), whatever the index width
        # Stable sort by (source, target) length: ties keep the permuted (or index) order.
        order = order[np.argsort(self._sort_key[order], kind="stable")]
        bounds = cut_points(self._longest[order], max_tokens=self.max_tokens, max_sentences=self.max_sentences)
        batch_order = np.arange(len(bounds) - 1)
        if self.shuffle:
            batch_order = rng.permutation(len(batch_order))
        return EpochPlan(order, bounds, batch_order)

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


def round_up(length, multiple: int):
    """``length`` (an int or an integer array) rounded up to a multiple of ``multiple``."""
    if isinstance(length, np.ndarray):
        length = length.astype(np.int64)  # unsigned lengths (uint16, as stored) would wrap around when negated
    return -(-length // multiple) * multiple


def padded_width(longest: int, multiple: int, at_most: int | None = None) -> int:
    """``longest`` rounded up to ``multiple``, but not past ``at_most`` (the positions a model has), and never
    below ``longest`` (a sequence is not cut: one too long is the model's to refuse)."""
    width = round_up(longest, multiple)
    return width if at_most is None else max(longest, min(width, at_most))


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int, *, multiple: int = 1,
              at_most: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token id lists into a LongTensor (B, T), T = the longest rounded up to ``multiple`` (fewer
    distinct shapes for a compiled model, tensor-core sizes on a GPU) but not past ``at_most`` (the model's
    positions: a learned table or a fixed-length part has no row beyond them); also return lengths (B,)."""
    if len(sequences) == 0:
        raise ValueError("cannot pad an empty batch")
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)  # (B,)
    width = padded_width(int(lengths.max()), multiple, at_most)
    tokens = torch.full((len(sequences), width), pad_id, dtype=torch.long)  # (B, T)
    for row, seq in enumerate(sequences):
        tokens[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return tokens, lengths
