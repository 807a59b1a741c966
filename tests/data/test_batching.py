"""Token-budget batching: budget respected, seeded per-epoch order, exact resumption, padding."""

from __future__ import annotations

import random

import numpy as np
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


def _greedy_reference(longest, order, max_tokens, cap):
    """The per-example loop that TokenBatchSampler cut with before cut_points vectorised it."""
    batches, current, current_max = [], [], 0
    for index in order:
        new_max = max(current_max, int(longest[index]))
        if current and (new_max * (len(current) + 1) > max_tokens or len(current) >= cap):
            batches.append(current)
            current, new_max = [], int(longest[index])
        current.append(index)
        current_max = new_max
    return batches + ([current] if current else [])


def test_array_lengths_give_the_per_example_loops_batches():
    """An (N, 2) uint16 array (the prepared corpus's lengths) gives the batches that the per-example loop
    gives on a list of pairs, for every epoch: same seed, same batches, in the same order."""
    rng = np.random.default_rng(0)
    for trial in range(25):
        n = int(rng.integers(1, 800))
        lengths = rng.integers(0 if trial % 5 == 0 else 1, 300 if trial % 4 == 0 else 60, size=(n, 2))
        max_tokens, cap = int(rng.integers(1, 400)), None if trial % 3 else int(rng.integers(1, 20))
        listed = TokenBatchSampler([tuple(x) for x in lengths.tolist()], max_tokens=max_tokens, max_sentences=cap,
                                   seed=trial)
        packed = TokenBatchSampler(lengths.astype(np.uint16), max_tokens=max_tokens, max_sentences=cap, seed=trial)
        for epoch in range(2):
            plan = packed.epoch_plan(epoch)
            cut = _greedy_reference(lengths.max(axis=1), plan.order.tolist(), max_tokens, cap or n)
            assert sorted(cut) == sorted(b.tolist() for b in plan)
            assert listed.epoch_batches(epoch) == packed.epoch_batches(epoch) == [b.tolist() for b in plan]


@pytest.mark.parametrize("multiple", [3, 8, 12])
def test_padding_multiples_cost_the_same_on_stored_uint16_lengths_as_on_python_ints(multiple):
    """A prepared corpus's lengths are uint16: rounding them up to ``pad_multiple`` must not wrap around (it
    did for multiples that do not divide 65536), so a batch's padded cost stays within ``max_tokens``."""
    lengths = np.array(PAIR_LENGTHS, dtype=np.uint16)
    packed = TokenBatchSampler(lengths, max_tokens=120, seed=3, pad_multiple=multiple)
    listed = TokenBatchSampler(PAIR_LENGTHS, max_tokens=120, seed=3, pad_multiple=multiple)
    assert packed.epoch_batches(0) == listed.epoch_batches(0)
    for batch in packed.epoch_batches(0):
        longest = max(max(PAIR_LENGTHS[i]) for i in batch)
        assert len(batch) * -(-longest // multiple) * multiple <= 120


def test_weighted_corpora_are_sampled_in_proportion():
    """Corpora of 1,000, 3,000 and 500 examples with weights 6 : 1 : 1. Over 20 seeded epochs the examples
    drawn from each corpus fit the multinomial with those probabilities (chi-square, 2 degrees of freedom,
    p > 0.001 fails one seed in a thousand), each epoch within 4.5 sd; a corpus's examples are used evenly."""
    sizes, weights = [1000, 3000, 500], [6.0, 1.0, 1.0]
    lengths = np.random.default_rng(1).integers(1, 40, size=(sum(sizes), 2)).astype(np.uint16)
    sampler = TokenBatchSampler(lengths, max_tokens=200, seed=7, corpus_sizes=sizes, weights=weights)
    total, p = sum(sizes), np.array(weights) / sum(weights)
    counts = np.zeros(3)
    for epoch in range(20):
        drawn = np.concatenate(list(sampler.epoch_plan(epoch)))
        assert len(drawn) == total
        per_corpus = np.bincount(np.searchsorted(np.cumsum(sizes), drawn, side="right"), minlength=3)
        assert np.all(np.abs(per_corpus - total * p) < 4.5 * np.sqrt(total * p * (1 - p)))
        if epoch == 0:  # corpus 0 is drawn ~3,375 times: every example 3 or 4 times, none more or less
            uses = np.bincount(drawn[drawn < 1000], minlength=1000)
            assert uses.min() == 3 and uses.max() == 4
        counts += per_corpus
    expected = 20 * total * p
    statistic = ((counts - expected) ** 2 / expected).sum()
    assert np.exp(-statistic / 2) > 0.001  # the chi-square survival function for 2 degrees of freedom
    assert sampler.epoch_batches(3) == sampler.epoch_batches(3)  # seeded: resumable


def test_weights_need_sizes_that_add_up():
    with pytest.raises(ValueError, match="add up"):
        TokenBatchSampler([1, 2, 3], max_tokens=4, corpus_sizes=[1, 1], weights=[1, 1])
    with pytest.raises(ValueError, match="go together"):
        TokenBatchSampler([1, 2, 3], max_tokens=4, weights=[1])
    with pytest.raises(ValueError, match="must be positive"):   # an empty corpus would lend its neighbour's
        TokenBatchSampler([1, 2, 3], max_tokens=4, corpus_sizes=[0, 3], weights=[1, 1])


def test_the_length_of_weighted_corpora_is_that_of_the_chosen_epoch():
    sizes = [300, 200]
    lengths = np.random.default_rng(2).integers(1, 30, size=(sum(sizes), 2)).astype(np.uint16)
    sampler = TokenBatchSampler(lengths, max_tokens=100, seed=3, corpus_sizes=sizes, weights=[3.0, 1.0])
    for epoch in range(5):
        sampler.set_epoch(epoch)
        assert len(sampler) == len(list(sampler)) == len(sampler.epoch_plan(epoch))
