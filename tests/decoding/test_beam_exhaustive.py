"""Beam search against an exhaustive reference: every output of a tiny vocabulary, scored by the documented rule.

The step function is a Python function of the whole prefix (seeded random log-probs, no model), so every
hypothesis up to the max length can be listed and scored as ``Hypothesis`` documents it: the sum of the token
log-probs with EOS, divided by ``(tokens + 1) ** alpha`` (fairseq) or ``((5 + tokens + 1) / 6) ** alpha`` (GNMT).
With a beam at least as wide as the number of outputs nothing is pruned, so the search must return exactly that
list, best first. Unlike ``test_beam_search._reference_beam`` this shares no rule with the search but the scoring.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from sanlab.decoding.search import beam_search, greedy_search

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4
VOCAB = 5
WORDS = (A, B)  # the tokens an output may hold (PAD and BOS are banned, EOS ends it)
SPECIAL = dict(bos=BOS, eos=EOS, pad=PAD)


def _log_probs(sentence: int, prefix: tuple[int, ...]) -> list[float]:
    """Next-token log-probs after ``prefix`` (BOS excluded) for ``sentence``: seeded by both, so a wrong cache
    reorder or a mixed-up sentence changes them. PAD and BOS get mass too: the search bans them without
    renormalising."""
    seed = sentence * 1_000_003 + sum((t + 1) * 7**i for i, t in enumerate(prefix)) * 31 + len(prefix)
    logits = 2 * torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return logits.log_softmax(0).tolist()


class PrefixModel:
    """``step`` over :func:`_log_probs`; the cache holds each row's sentence and prefix (BOS first)."""

    def __init__(self, log_probs=_log_probs):
        self.log_probs = log_probs

    @staticmethod
    def cache(sentences: list[int]) -> dict:
        ids = torch.tensor(sentences)
        return {"sentence": ids, "prefix": torch.zeros(len(sentences), 0, dtype=torch.long)}

    def __call__(self, tokens, cache):
        prefix = torch.cat([cache["prefix"], tokens], 1)
        rows = [self.log_probs(s, tuple(p[1:])) for s, p in zip(cache["sentence"].tolist(), prefix.tolist())]
        return torch.tensor(rows, dtype=torch.float64), {"sentence": cache["sentence"], "prefix": prefix}


def _penalty(length: int, alpha: float, style: str) -> float:
    """The length penalty of an output of ``length`` tokens, EOS included, as the search documents it."""
    return length ** alpha if style == "fairseq" else ((5 + length) / 6) ** alpha


def _exhaustive(sentence: int, *, max_len: int, alpha: float, min_length: int = 0, log_probs=_log_probs,
                style: str = "fairseq"):
    """Every output of at most ``max_len`` tokens with EOS (at least ``min_length`` before it) as (tokens, score,
    log_prob, positional), ranked by score; ties: shorter first, then in token order (the search's finishing
    order: see ``test_ties_are_broken_by_length_then_token_order``)."""
    out = []
    for n in range(min_length, max_len):
        for tokens in itertools.product(WORDS, repeat=n):
            positional = [log_probs(sentence, tokens[:i])[tok] for i, tok in enumerate(tokens + (EOS,))]
            total = math.fsum(positional)
            out.append((list(tokens), total / _penalty(n + 1, alpha, style), total, positional))
    return sorted(out, key=lambda h: -h[1])  # stable: itertools lists shorter first, then in token order


def _outputs(max_len: int, min_length: int = 0) -> int:
    return sum(len(WORDS) ** n for n in range(min_length, max_len))


def _search(sentences, max_lengths, *, beam, alpha=1.0, min_length=0, model=None, style="fairseq"):
    model = model or PrefixModel()
    return beam_search(model, model.cache(sentences), batch_size=len(sentences), beam_size=beam, n_best=beam,
                       max_lengths=torch.tensor(max_lengths), length_penalty=alpha, length_penalty_style=style,
                       min_length=min_length, **SPECIAL)


def _assert_same(found, expected):
    assert [h.tokens for h in found] == [e[0] for e in expected]
    assert [h.score for h in found] == pytest.approx([e[1] for e in expected], abs=1e-6)
    assert [h.log_prob for h in found] == pytest.approx([e[2] for e in expected], abs=1e-6)
    for h, e in zip(found, expected):
        assert h.positional_scores == pytest.approx(e[3], abs=1e-6)


@pytest.mark.parametrize("style", ["fairseq", "gnmt"])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
@pytest.mark.parametrize("max_len", [1, 2, 4, 5])
@pytest.mark.parametrize("extra", [0, 3])  # a beam of exactly the number of outputs, and a wider one
def test_a_beam_as_wide_as_all_outputs_returns_them_all_ranked(alpha, max_len, extra, style):
    beam = _outputs(max_len) + extra
    (found,) = _search([0], [max_len], beam=beam, alpha=alpha, style=style)
    expected = _exhaustive(0, max_len=max_len, alpha=alpha, style=style)
    _assert_same(found, expected)  # the n-best list and its scores: the same normalised scores
    assert all(len(h.tokens) < max_len for h in found)  # max length counts EOS
    # an output cut at the max length is kept, ended by a forced EOS that keeps the model's log-prob
    assert any(len(h.tokens) == max_len - 1 for h in found)


@pytest.mark.parametrize("min_length", [1, 3])
def test_min_length_removes_exactly_the_shorter_outputs(min_length):
    max_len = 5
    (found,) = _search([1], [max_len], beam=_outputs(max_len), alpha=1.0, min_length=min_length)
    _assert_same(found, _exhaustive(1, max_len=max_len, alpha=1.0, min_length=min_length))


@pytest.mark.parametrize("style", ["fairseq", "gnmt"])
def test_the_best_of_a_wide_beam_is_the_exhaustive_best_for_many_sentences(style):
    for s in range(20):
        (found,) = _search([s], [4], beam=_outputs(4), alpha=1.0, style=style)
        best = _exhaustive(s, max_len=4, alpha=1.0, style=style)[0]
        assert (found[0].tokens, found[0].score) == (best[0], pytest.approx(best[1], abs=1e-6))


def test_the_two_forms_choose_other_outputs_as_the_reference_does():
    """GNMT's form penalises length less than fairseq's at the same alpha (((5 + L) / 6) < L past L = 1), so it
    prefers shorter outputs: the style reaches the ranking, and the searched best follows the reference's."""
    differ = 0
    for s in range(20):
        best = {style: _search([s], [4], beam=_outputs(4), alpha=1.0, style=style)[0][0].tokens
                for style in ("fairseq", "gnmt")}
        assert best == {style: _exhaustive(s, max_len=4, alpha=1.0, style=style)[0][0] for style in best}
        assert len(best["gnmt"]) <= len(best["fairseq"])
        differ += best["gnmt"] != best["fairseq"]
    assert differ >= 1


def test_batched_sentences_of_different_max_lengths_equal_one_at_a_time():
    max_lengths = [3, 1, 5, 2, 4]
    sentences = list(range(10, 10 + len(max_lengths)))
    beam = _outputs(max(max_lengths))  # wide enough for each: every sentence gets its exhaustive list
    batched = _search(sentences, max_lengths, beam=beam, alpha=0.6)
    for s, m, found in zip(sentences, max_lengths, batched):
        assert found == _search([s], [m], beam=beam, alpha=0.6)[0]
        _assert_same(found, _exhaustive(s, max_len=m, alpha=0.6))


@pytest.mark.parametrize("max_len", [1, 3, 6])
def test_greedy_takes_the_argmax_at_every_step(max_len):
    for s in range(5):
        (found,) = greedy_search(PrefixModel(), PrefixModel.cache([s]), batch_size=1,
                                 max_lengths=torch.tensor([max_len]), **SPECIAL)
        tokens, total = [], 0.0
        for t in range(max_len):
            lp = _log_probs(s, tuple(tokens))
            allowed = [EOS] if t + 1 == max_len else [EOS, *WORDS]
            token = max(allowed, key=lambda v: (lp[v], -v))  # ties: the lower id
            total += lp[token]
            if token == EOS:
                break
            tokens.append(token)
        assert found[0].tokens == tokens
        assert found[0].log_prob == pytest.approx(total, abs=1e-9)
        assert found[0].score == pytest.approx(total / (len(tokens) + 1), abs=1e-9)


def _uniform(sentence, prefix):
    return [math.log(1 / 3) if v in (EOS, *WORDS) else float("-inf") for v in range(VOCAB)]


def test_ties_are_broken_by_length_then_token_order():
    # Every output scores log(1/3) with alpha 1 (forced EOS keeps its 1/3): all tie. They finish shortest first
    # and, within a step, in beam then token order, which for tied prefixes is token order.
    max_len = 4
    model = PrefixModel(_uniform)
    expected = _exhaustive(0, max_len=max_len, alpha=1.0, log_probs=_uniform)
    for _ in range(2):  # and the same again
        (found,) = _search([0], [max_len], beam=_outputs(max_len), alpha=1.0, model=model)
        _assert_same(found, expected)
    assert [h.score for h in found] == pytest.approx([math.log(1 / 3)] * _outputs(max_len))
    assert [h.tokens for h in found[:4]] == [[], [A], [B], [A, A]]
