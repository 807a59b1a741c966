"""Token-budget batching: budget respected, seeded per-epoch order, exact resumption, padding."""

from __future__ import annotations

import random

import pytest
import torch

from sanlab.data.batching import TokenBatchSampler, pad_batch

_rng = random.Random(0)
LENGTHS = [_rng.randint(1, 30) for _ in range(500)]
PAIR_LENGTHS = [(n, max(1, n + _rng.randint(-5, 5))) for n in LENGTHS]


def cost(batch, lengths):
    longest = [max(n) if isinstance(n, tuple) else n for n in lengths]
    return len(batch) * max(longest[i] for i in batch)


@pytest.mark.parametrize("lengths", [LENGTHS, PAIR_LENGTHS])
def test_every_example_once_within_budget(lengths):
    sampler = TokenBatchSampler(lengths, max_tokens=128, max_sentences=10, seed=1)
    for epoch in range(3):
        batches = sampler.epoch_batches(epoch)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        assert all(cost(b, lengths) <= 128 and len(b) <= 10 for b in batches)
        assert len(batches) == len(sampler)


def test_pair_cost_uses_the_longer_side():
    sampler = TokenBatchSampler([(2, 10), (2, 10), (2, 10)], max_tokens=20, shuffle=False)
    assert sampler.epoch_batches(0) == [[0, 1], [2]]


def test_batches_are_length_buckets():
    sampler = TokenBatchSampler(LENGTHS, max_tokens=200, shuffle=False)
    batches = sampler.epoch_batches(0)
    padded = sum(cost(b, LENGTHS) for b in batches)
    assert sum(LENGTHS) / padded > 0.9  # sorted order puts near-equal lengths together
    assert [LENGTHS[b[0]] for b in batches] == sorted(LENGTHS[b[0]] for b in batches)


def test_oversized_example_gets_its_own_batch():
    sampler = TokenBatchSampler([3, 50, 3, 4], max_tokens=16, shuffle=False)
    assert sampler.oversized == [1]
    assert sampler.epoch_batches(0) == [[0, 2, 3], [1]]


def test_order_is_seeded_by_seed_and_epoch():
    a = TokenBatchSampler(LENGTHS, max_tokens=100, seed=7)
    b = TokenBatchSampler(LENGTHS, max_tokens=100, seed=7)
    c = TokenBatchSampler(LENGTHS, max_tokens=100, seed=8)
    assert a.epoch_batches(3) == b.epoch_batches(3)
    assert a.epoch_batches(3) != a.epoch_batches(4)
    assert a.epoch_batches(3) != c.epoch_batches(3)
    # Equal lengths are permuted per epoch, so batch contents change, not only their order.
    contents = lambda batches: sorted(tuple(sorted(b)) for b in batches)  # noqa: E731
    assert contents(a.epoch_batches(0)) != contents(a.epoch_batches(1))


def test_no_shuffle_is_sorted_and_epoch_independent():
    sampler = TokenBatchSampler(LENGTHS, max_tokens=100, shuffle=False)
    flat = [i for b in sampler.epoch_batches(0) for i in b]
    assert flat == sorted(range(len(LENGTHS)), key=lambda i: (LENGTHS[i], i))
    assert sampler.epoch_batches(0) == sampler.epoch_batches(5)


def test_dataloader_style_iteration():
    sampler = TokenBatchSampler(LENGTHS, max_tokens=100, seed=2)
    sampler.set_epoch(4)
    assert list(sampler) == sampler.epoch_batches(4)


def test_epoch_batches_are_a_pure_function_of_lengths_seed_and_epoch():
    # what exact resumption rests on: a resumed run rebuilds the sampler and continues at batch p of epoch e
    make = lambda: TokenBatchSampler(PAIR_LENGTHS, max_tokens=150, seed=3)  # noqa: E731
    first, rebuilt = make(), make()
    for epoch in range(3):
        assert first.epoch_batches(epoch) == rebuilt.epoch_batches(epoch)
    assert first.epoch_batches(0) != first.epoch_batches(1)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="max_tokens"):
        TokenBatchSampler(LENGTHS, max_tokens=0)
    with pytest.raises(ValueError, match="empty"):
        TokenBatchSampler([], max_tokens=10)


def test_pad_batch():
    tokens, lengths = pad_batch([[5, 6, 7], [8], []], pad_id=0)
    assert tokens.dtype == torch.long and tokens.shape == (3, 3)
    assert tokens.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert lengths.tolist() == [3, 1, 0]
    with pytest.raises(ValueError):
        pad_batch([], pad_id=0)


def test_lazy_batches_build_only_what_is_read():
    from sanlab.data.batching import LazyBatches

    built = []
    batches = LazyBatches([[0, 1], [2], [3, 4, 5]], lambda idx: built.append(idx) or sum(idx))
    assert len(batches) == 3 and built == []
    assert batches[1:3] == [2, 12] and batches[0] == 1
    assert built == [[2], [3, 4, 5], [0, 1]]
