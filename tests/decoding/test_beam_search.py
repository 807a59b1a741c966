"""Beam search on hand-written probability tables (the fairseq ``sequence_generator_setup`` idea).

A stub model replays a table ``prefix -> next-token probabilities`` per sentence. The prefix lives
in the cache as a tensor, so a wrong cache reorder shows up as a wrong result. Expected tokens are
traced by hand in the comments; expected scores are derived from the same tables.
"""

from __future__ import annotations

import math

import pytest
import torch

import sanlab.decoding.search as search
from sanlab.decoding.search import Hypothesis, beam_search, greedy_search, rescore
from tests_helpers import HostReads

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4
VOCAB = 5
SPECIAL = dict(bos=BOS, eos=EOS, pad=PAD)

# Beam 2 beats greedy, length normalisation flips the ranking, and the max length forces EOS.
TREE = {
    (): {A: 0.6, B: 0.4},
    (A,): {EOS: 0.25, A: 0.4, B: 0.35},
    (B,): {EOS: 0.7, A: 0.2, B: 0.1},
    (A, A): {EOS: 0.5, A: 0.5},
    (A, B): {EOS: 0.9, A: 0.1},
    (B, A): {EOS: 0.5, A: 0.5},
    (B, B): {EOS: 0.5, A: 0.5},
}
# EOS is the model's first choice at once; min_length has to push past it.
EAGER = {
    (): {EOS: 0.5, A: 0.3, B: 0.2},
    (A,): {EOS: 0.6, A: 0.3, B: 0.1},
    (A, A): {EOS: 0.7, B: 0.3},
}
# Never wants to stop, and A-then-B ties with B-then-A.
CHATTY = {"*": {EOS: 0.01, A: 0.6, B: 0.39}}


class TableModel:
    """``step`` for per-sentence tables; a table may give one row ``"*"`` used for every prefix."""

    def __init__(self, tables: list[dict]):
        self.tables = tables
        self.rows_seen: list[int] = []

    def cache(self) -> dict:
        n = len(self.tables)
        return {"sentence": torch.arange(n), "prefix": torch.zeros(n, 0, dtype=torch.long)}

    def __call__(self, tokens: torch.Tensor, cache: dict):
        self.rows_seen.append(tokens.shape[0])
        prefix = torch.cat([cache["prefix"], tokens], 1)  # [N, 1+t] BOS first
        assert bool((prefix[:, 0] == BOS).all())
        rows = []
        for s, p in zip(cache["sentence"].tolist(), prefix[:, 1:].tolist()):
            table = self.tables[s]
            probs = table.get(tuple(p), table.get("*"))
            assert probs is not None, f"prefix {p} of sentence {s} is not in the table"
            rows.append([probs.get(v, 0.0) for v in range(VOCAB)])
        return torch.tensor(rows).log(), {"sentence": cache["sentence"], "prefix": prefix}


def _search(tables, *, max_len, **kwargs):
    model = TableModel(tables)
    max_lengths = torch.tensor(max_len if isinstance(max_len, list) else [max_len] * len(tables))
    return beam_search(model, model.cache(), batch_size=len(tables), max_lengths=max_lengths, **SPECIAL, **kwargs)


def _path(table, tokens):
    """Log-probs of ``tokens`` then EOS under ``table``, from the table itself."""
    out = []
    for t, token in enumerate(tokens + [EOS]):
        probs = table.get(tuple(tokens[:t]), table.get("*"))
        out.append(math.log(probs[token]))
    return out


def _assert_hyp(hyp: Hypothesis, table, tokens, *, score_of):
    positional = _path(table, tokens)
    assert hyp.tokens == tokens
    assert hyp.positional_scores == pytest.approx(positional, rel=1e-6)
    assert hyp.log_prob == pytest.approx(sum(positional), rel=1e-6)
    assert hyp.score == pytest.approx(score_of(sum(positional), len(tokens) + 1), rel=1e-6)


def _fairseq(alpha):
    return lambda log_prob, length: log_prob / length**alpha


# Beam 2 on TREE, by hand:
#  step 0: only beam 0 is live: A .6, B .4 (no EOS among the best 2).
#  step 1: B.EOS .28, AA .24, AB .21, A.EOS .15, ... -> [B] finishes; A.EOS ranks 3rd of 4 and is
#          dropped; AA and AB stay live.
#  step 2: max length 3 forces EOS: AB.EOS .189, AA.EOS .12 -> [A B] finishes, which makes 2;
#          AA, finished at the same step but worse, is dropped.
@pytest.mark.parametrize(
    ("alpha", "style", "score_of", "ranking"),
    [
        (0.0, "fairseq", _fairseq(0.0), [[B], [A, B]]),  # raw: log .28 > log .189
        (1.0, "fairseq", _fairseq(1.0), [[A, B], [B]]),  # log(.189)/3 > log(.28)/2
        (1.0, "gnmt", lambda lp, n: lp / ((5 + n) / 6), [[B], [A, B]]),
    ],
)
def test_beam_on_tree_matches_hand_trace(alpha, style, score_of, ranking):
    (hyps,) = _search([TREE], max_len=3, beam_size=2, n_best=2, length_penalty=alpha, length_penalty_style=style)
    assert [h.tokens for h in hyps] == ranking
    for hyp, tokens in zip(hyps, ranking):
        _assert_hyp(hyp, TREE, tokens, score_of=score_of)
    (best,) = _search([TREE], max_len=3, beam_size=2, n_best=1, length_penalty=alpha, length_penalty_style=style)
    assert best == hyps[:1]


def test_greedy_on_tree_takes_the_argmax_path():
    # A (.6), then AA (.4 beats EOS .25 and B .35), then EOS forced at length 3.
    model = TableModel([TREE])
    (hyps,) = greedy_search(model, model.cache(), batch_size=1, max_lengths=torch.tensor([3]), **SPECIAL)
    assert len(hyps) == 1
    _assert_hyp(hyps[0], TREE, [A, A], score_of=_fairseq(1.0))
    assert hyps == _search([TREE], max_len=3, beam_size=1)[0]


@pytest.mark.parametrize(("min_length", "tokens"), [(0, []), (1, [A]), (2, [A, A]), (3, [A, A, B])])
def test_min_length_bans_eos_without_renormalising(min_length, tokens):
    table = {**EAGER, (A, A, B): {EOS: 1.0}}
    (hyps,) = _search([table], max_len=4, beam_size=1, min_length=min_length)
    _assert_hyp(hyps[0], table, tokens, score_of=_fairseq(1.0))


def test_max_length_forces_eos_per_sentence():
    hyps = _search([CHATTY] * 3, max_len=[1, 4, 2], beam_size=1, length_penalty=0.0)
    assert [h[0].tokens for h in hyps] == [[], [A, A, A], [A]]
    _assert_hyp(hyps[1][0], CHATTY, [A, A, A], score_of=_fairseq(0.0))
    assert hyps[1][0].positional_scores[-1] == pytest.approx(math.log(0.01))


def test_the_cache_is_reordered_only_when_rows_move(monkeypatch):
    """With one beam every row continues itself until a sentence leaves; with two, rows move every step, within
    their sentences (the source side may stay) except when a sentence leaves."""
    reorders = []  # per call: (rows kept, within_sentences)
    real = search.reorder
    monkeypatch.setattr(search, "reorder", lambda cache, index, *, within_sentences=False: reorders.append(
        (len(index), within_sentences)) or real(cache, index, within_sentences=within_sentences))
    hyps = _search([CHATTY] * 3, max_len=[4, 6, 6], beam_size=1, length_penalty=0.0)
    assert [h[0].tokens for h in hyps] == [[A] * 3, [A] * 5, [A] * 5]
    assert reorders == [(2, False)]  # after step 3 (0-based), when the first sentence leaves
    reorders.clear()
    _search([CHATTY] * 3, max_len=[4, 6, 6], beam_size=2, length_penalty=0.0)
    assert reorders == [(6, True)] * 3 + [(4, False), (4, True)]  # after every step but the last


def test_ties_go_to_the_lower_beam_and_n_best_is_sorted():
    # step 1: AA .36, then AB and BA tie exactly (.6 * .39); AB continues beam 0, so it wins.
    (hyps,) = _search([CHATTY], max_len=3, beam_size=2, n_best=2, length_penalty=0.0)
    assert [h.tokens for h in hyps] == [[A, A], [A, B]]
    assert hyps[0].score > hyps[1].score


def test_ties_follow_beam_then_token_order_whatever_topk_does():
    # All continuations of A and B tie at every step; torch.topk orders ties arbitrarily.
    # Beam 2. step 0: A, B (equal) -> beams A, B;  step 1: AA, AB, BA, BB tie -> AA, AB stay live
    # (beam 0 first); step 2: EOS forced, AA.EOS and AB.EOS tie and finish in that order.
    # Beam 3. step 0: EOS ranks 3rd -> [] finishes; step 1: AA, AB, BA (of 4 tied) stay live;
    # step 2: their 3 tied EOS continuations fill the 2 free places in that order.
    flat = {"*": {EOS: 0.2, A: 0.4, B: 0.4}}
    for beam_size, expected in [(2, [[A, A], [A, B]]), (3, [[], [A, A], [A, B]])]:
        (hyps,) = _search([flat], max_len=3, beam_size=beam_size, n_best=beam_size, length_penalty=0.0)
        assert [h.tokens for h in hyps] == expected


def test_ties_across_the_best_2k_boundary_go_to_the_lower_token_ids():
    # Beam 1 keeps 2 of 3 tied continuations (EOS, A, B at .25 each): the lower ids, EOS and A. EOS is the best 1:
    # [] finishes and the sentence is done. Were the higher ids kept (B, A), A would stay live instead.
    flat = {"*": {EOS: 0.25, A: 0.25, B: 0.25}}
    (hyps,) = _search([flat], max_len=3, beam_size=1, n_best=1, length_penalty=0.0)
    assert [h.tokens for h in hyps] == [[]]


def test_a_sentence_stops_once_beam_size_hypotheses_finished():
    # step 0: EOS .5 and A .3 are the best 2 -> [] finishes; A and B stay live.
    # step 1: A.EOS .15 and B.EOS .10 are the best 2 -> [A] finishes, which makes 2: done, although
    # the max length is 10; [B], finished at the same step but worse, is dropped.
    model = TableModel([{"*": {EOS: 0.5, A: 0.3, B: 0.2}}])
    (hyps,) = beam_search(model, model.cache(), batch_size=1, beam_size=2, n_best=2, max_lengths=torch.tensor([10]),
                          length_penalty=0.0, **SPECIAL)
    assert [h.tokens for h in hyps] == [[], [A]]
    assert model.rows_seen == [2, 2]


# ---- a random model: batched equals one at a time ------------------------------------------

class TrigramModel:
    """Random next-token log-probs per sentence given the last two tokens; sentence id in the cache."""

    def __init__(self, n_sentences: int, *, vocab: int = 7, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        logits = 2 * torch.randn(n_sentences, vocab, vocab, vocab, generator=g)
        logits[..., EOS] += torch.linspace(-3.0, 1.0, n_sentences).view(-1, 1, 1)  # sentences stop at different times
        self.table = logits.log_softmax(-1)  # [S, prev, last, V]
        self.rows_seen: list[int] = []

    def cache(self, sentences: list[int]) -> dict:
        ids = torch.tensor(sentences)
        return {"sentence": ids, "prev": torch.full_like(ids, BOS)}

    def __call__(self, tokens, cache):
        self.rows_seen.append(tokens.shape[0])
        last = tokens[:, 0]
        return self.table[cache["sentence"], cache["prev"], last], {"sentence": cache["sentence"], "prev": last}


MAX_LENGTHS = [2, 9, 5, 12, 1, 7]


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize(("alpha", "style"), [(1.0, "fairseq"), (0.0, "fairseq"), (0.6, "gnmt")])
def test_batched_equals_one_sentence_at_a_time(beam_size, alpha, style):
    n = len(MAX_LENGTHS)
    model = TrigramModel(n)
    options = dict(**SPECIAL, beam_size=beam_size, n_best=beam_size, length_penalty=alpha,
                   length_penalty_style=style)
    batched = beam_search(model, model.cache(list(range(n))), batch_size=n, max_lengths=torch.tensor(MAX_LENGTHS),
                          **options)
    assert model.rows_seen[0] == n * beam_size and len(set(model.rows_seen)) > 2  # finished sentences left
    for s in range(n):
        alone = beam_search(model, model.cache([s]), batch_size=1, max_lengths=torch.tensor(MAX_LENGTHS[s:s + 1]),
                            **options)[0]
        assert batched[s] == alone  # tokens, scores and positional scores, exactly
        possible = 1 if MAX_LENGTHS[s] == 1 else beam_size  # max length 1 leaves only the empty output
        assert len({tuple(h.tokens) for h in alone}) == len(alone) == possible  # beams never duplicate
        assert all(len(h.tokens) < MAX_LENGTHS[s] for h in alone)
        assert [h.score for h in alone] == sorted((h.score for h in alone), reverse=True)
    assert len({len(h[0].tokens) for h in batched}) > 2


def _reference_beam(table: torch.Tensor, *, k: int, max_len: int, penalty, min_length: int = 0) -> list[tuple]:
    """The module docstring's rules written out plainly, one sentence, lists of hypotheses, no tensors,
    no cache: a check on the batched search that shares none of its code. ``table`` [prev, last, V]."""
    vocab = table.shape[-1]
    live, finished = [((), 0.0)], []          # (tokens, cumulative log-prob)
    for t in range(max_len):
        candidates = []
        for beam, (tokens, logp) in enumerate(live):
            prev, last = ((BOS, BOS) + tokens)[-2:]
            for v in range(vocab):
                if v in (PAD, BOS) or (v == EOS and t < min_length) or (t + 1 == max_len and v != EOS):
                    continue
                candidates.append((logp + float(table[prev, last, v]), beam, v))
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))  # score, then lower beam, then lower token
        next_live = []
        for rank, (logp, beam, v) in enumerate(candidates[:2 * k]):
            if v == EOS:
                if rank < k and len(finished) < k:
                    finished.append((live[beam][0], logp))
            elif len(next_live) < k and math.isfinite(logp):
                next_live.append((live[beam][0] + (v,), logp))
        live = next_live
        if len(finished) >= k or not live:
            break
    ranked = sorted(finished, key=lambda h: -penalty(h[1], len(h[0]) + 1))  # stable: ties keep finishing order
    return [(list(tokens), penalty(logp, len(tokens) + 1)) for tokens, logp in ranked]


def _gnmt(alpha):
    return lambda logp, n: logp / ((5 + n) / 6) ** alpha


@pytest.mark.parametrize("beam_size", [1, 2, 3, 4])
@pytest.mark.parametrize(("alpha", "style"), [(0.0, "fairseq"), (1.0, "fairseq"), (0.6, "gnmt")])
@pytest.mark.parametrize("min_length", [0, 2])
@pytest.mark.parametrize("n_best", ["beam", 1])
def test_batched_beam_equals_a_plain_reference_search(beam_size, alpha, style, min_length, n_best):
    max_lengths = [m for m in MAX_LENGTHS if m > min_length]  # room for EOS after min_length tokens
    n = len(max_lengths)
    n_best = beam_size if n_best == "beam" else n_best
    model = TrigramModel(n, seed=3)
    found = beam_search(model, model.cache(list(range(n))), batch_size=n, max_lengths=torch.tensor(max_lengths),
                        beam_size=beam_size, n_best=n_best, length_penalty=alpha, length_penalty_style=style,
                        min_length=min_length, **SPECIAL)
    penalty = _fairseq(alpha) if style == "fairseq" else _gnmt(alpha)
    for s, max_len in enumerate(max_lengths):
        expected = _reference_beam(model.table[s].double(), k=beam_size, max_len=max_len, penalty=penalty,
                                   min_length=min_length)[:n_best]
        assert [h.tokens for h in found[s]] == [tokens for tokens, _ in expected], f"sentence {s}"
        assert [h.score for h in found[s]] == pytest.approx([score for _, score in expected], rel=1e-5)


def _argmax_loop(table: torch.Tensor, max_len: int) -> tuple[list[int], float]:
    prev, last, total, tokens = BOS, BOS, torch.zeros(()), []
    for t in range(max_len):
        lp = table[prev, last].clone()
        lp[[PAD, BOS]] = float("-inf")
        if t + 1 == max_len:
            lp[torch.arange(lp.numel()) != EOS] = float("-inf")
        token = int(lp.argmax())
        total = total + lp[token]
        if token == EOS:
            break
        tokens.append(token)
        prev, last = last, token
    return tokens, float(total)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_bos_and_pad_are_never_emitted_even_when_the_model_prefers_them(beam_size):
    model = TableModel([{"*": {PAD: 0.3, BOS: 0.4, A: 0.2, EOS: 0.1}}])
    hyps = beam_search(model, model.cache(), batch_size=1, beam_size=beam_size, n_best=beam_size,
                       max_lengths=torch.tensor([4]), **SPECIAL)[0]
    assert hyps and all(set(h.tokens) <= {A} for h in hyps)
    assert hyps[0].positional_scores[0] == pytest.approx(math.log(0.2))  # not renormalised


def test_one_symbol_for_bos_and_eos_is_banned_as_bos_but_not_as_eos():
    """fairseq's dictionaries start a target with EOS: with ``bos == eos`` the symbol must stay choosable."""
    table = {(): {A: 0.7, EOS: 0.3}, (A,): {EOS: 0.8, A: 0.2}}

    def step(tokens, prefix):
        prefix = torch.cat([prefix, tokens], 1)  # [N, 1+t], EOS first
        assert bool((prefix[:, 0] == EOS).all())
        # (a prefix not in the table is a row that is not live: it has a score of -inf)
        rows = [[table.get(tuple(p), {}).get(v, 0.0) for v in range(VOCAB)] for p in prefix[:, 1:].tolist()]
        return torch.tensor(rows).log(), prefix

    # beam 2: EOS (.3) finishes [] at once, A.EOS (.56) finishes [A] next; ranked by log-prob / length
    hyps = beam_search(step, torch.zeros(1, 0, dtype=torch.long), batch_size=1, beam_size=2, n_best=2,
                       bos=EOS, eos=EOS, pad=PAD, max_lengths=torch.tensor([5]))[0]
    assert [h.tokens for h in hyps] == [[A], []]
    assert [h.log_prob for h in hyps] == pytest.approx([math.log(0.7 * 0.8), math.log(0.3)])


def test_greedy_is_beam_one_and_a_hand_argmax_loop():
    n = len(MAX_LENGTHS)
    model = TrigramModel(n, seed=1)
    max_lengths = torch.tensor(MAX_LENGTHS)
    greedy = greedy_search(model, model.cache(list(range(n))), batch_size=n, max_lengths=max_lengths, **SPECIAL)
    beam = beam_search(model, model.cache(list(range(n))), batch_size=n, max_lengths=max_lengths, beam_size=1,
                       **SPECIAL)
    assert greedy == beam
    for s, (hyp,) in enumerate(greedy):
        tokens, log_prob = _argmax_loop(model.table[s], MAX_LENGTHS[s])
        assert hyp.tokens == tokens and hyp.log_prob == log_prob
        assert hyp.score == log_prob / (len(tokens) + 1)


# ---- user errors ----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(beam_size=2, n_best=3), "n_best"),
        (dict(beam_size=2, length_penalty_style="average"), "length_penalty_style"),
        (dict(beam_size=2, min_length=3), "min_length=3"),
        (dict(beam_size=2, max_len=[3, 3]), r"shape \(1,\)"),
    ],
)
def test_bad_arguments_say_what_was_wrong(kwargs, message):
    kwargs = {"max_len": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        _search([TREE], **kwargs)


def test_bad_step_output_is_reported():
    def step(tokens, cache):
        return torch.zeros(tokens.shape[0] + 1, VOCAB), cache

    with pytest.raises(ValueError, match=r"\[2, V\].*got \(3, 5\)"):
        beam_search(step, None, batch_size=1, beam_size=2, max_lengths=torch.tensor([3]), **SPECIAL)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["NaN", "+inf"])
@pytest.mark.parametrize("at_step", [0, 2])
def test_nan_or_posinf_log_probs_stop_the_search(bad, at_step):
    """A NaN or +inf anywhere in a step's log-probs (here one entry of one row) stops the search with a message.
    The other entries are finite: beside a -inf (a token of probability 0) a +inf would sum to NaN anyway."""
    model = TableModel([CHATTY, CHATTY])
    steps = []

    def step(tokens, cache):
        log_probs, cache = model(tokens, cache)
        log_probs = log_probs.clamp(min=-30.0)
        if len(steps) == at_step:
            log_probs[-1, B] = bad
        steps.append(tokens.shape[0])
        return log_probs, cache

    with pytest.raises(ValueError, match=r"NaN or \+inf"):
        beam_search(step, model.cache(), batch_size=2, beam_size=2, max_lengths=torch.tensor([5, 5]), **SPECIAL)
    assert len(steps) == at_step + 1  # at the step that returned it


def test_a_sentence_without_a_finite_continuation_leaves_the_search():
    """A sentence whose every continuation has -inf log-probability has no live hypothesis left: it leaves the
    batch (with what it finished before) while the other goes on."""
    dead_end = {(): {A: 0.5, B: 0.5}, "*": {}}  # after the first token every token has probability 0
    model = TableModel([dead_end, CHATTY])
    found = beam_search(model, model.cache(), batch_size=2, beam_size=3, n_best=3, max_lengths=torch.tensor([4, 4]),
                        **SPECIAL)
    # nothing finished: EOS had probability 0 too (with 3 beams it is among the best 3 of the -inf continuations,
    # which finish nothing)
    assert found[0] == []
    assert model.rows_seen[:3] == [6, 6, 3]  # it left after the step that found no finite continuation
    assert found[1] == _search([CHATTY], max_len=4, beam_size=3, n_best=3)[0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_step_in_another_dtype_than_float32_is_searched(dtype):
    """A step may return float64 (an exact reference) or bf16 log-probs: the search keeps its scores in the wider
    of that and float32. (It raised "Index put requires the source and destination dtypes match" on the first
    finished hypothesis: the tensors it starts with, before the first step, were float32.)"""
    model = TrigramModel(3, seed=2)

    def step(tokens, cache):
        log_probs, cache = model(tokens, cache)
        return log_probs.to(dtype), cache

    found = beam_search(step, model.cache([0, 1, 2]), batch_size=3, max_lengths=torch.tensor([1, 4, 6]),
                        beam_size=3, n_best=3, **SPECIAL)
    wide = torch.promote_types(dtype, torch.float32)
    for s, hyps in enumerate(found):
        assert hyps, f"sentence {s}"
        for h in hyps:  # each score is the sum of the step's own log-probs, in the wider dtype
            tokens = [BOS, BOS] + h.tokens + [EOS]
            lps = [model.table[s, tokens[i], tokens[i + 1], tokens[i + 2]].to(dtype) for i in range(len(h.tokens) + 1)]
            assert h.positional_scores == [float(lp) for lp in lps]
            assert h.log_prob == pytest.approx(float(sum(lp.to(wide) for lp in lps)), rel=1e-12)


# ---- host reads ------------------------------------------------------------------------------

@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_search_reads_the_host_once_per_step(beam_size):
    """Its bookkeeping stays on the device; each step reads one small vector (the module docstring says
    why), and the hypotheses are read once at the end."""
    n = len(MAX_LENGTHS)
    model = TrigramModel(n)
    reads = HostReads()

    def step(tokens, cache):
        reads.mark()
        return model(tokens, cache)

    with reads:
        found = beam_search(step, model.cache(list(range(n))), batch_size=n, max_lengths=torch.tensor(MAX_LENGTHS),
                            beam_size=beam_size, n_best=beam_size, **SPECIAL)
    before, *between, after = (segment.split() for segment in " ".join(reads.events).split("step"))
    assert len(between) + 1 == len(model.rows_seen) >= 5 and len(set(model.rows_seen)) > 2  # sentences left
    assert all(segment == ["tolist"] for segment in between), between
    assert len(before) <= 3 and after[0] == "tolist" and len(after) <= 6  # arguments; the last step; the results
    assert found == beam_search(model, model.cache(list(range(n))), batch_size=n,
                                max_lengths=torch.tensor(MAX_LENGTHS), beam_size=beam_size, n_best=beam_size,
                                **SPECIAL)


def test_rescore_ranks_the_same_outputs_by_new_scores():
    a = Hypothesis(tokens=[A], score=-0.5, log_prob=-1.0, positional_scores=[-0.4, -0.6])
    b = Hypothesis(tokens=[A, B], score=-0.6, log_prob=-1.8, positional_scores=[-0.5, -0.6, -0.7])
    again = rescore([a, b], [[-0.9, -0.9], [-0.5, -0.5, -0.5]], length_penalty=1.0)
    assert [h.tokens for h in again] == [[A, B], [A]]
    assert again[0].log_prob == pytest.approx(-1.5) and again[0].score == pytest.approx(-0.5)
    assert again[1].score == pytest.approx(-0.9) and again[1].positional_scores == [-0.9, -0.9]
    tied = rescore([a, b], [[-1.0, -1.0], [-1.0, -1.0, -1.0]], length_penalty=1.0)
    assert [h.tokens for h in tied] == [[A], [A, B]]  # ties keep the given order
    with pytest.raises(ValueError, match="3 scores for 1 tokens and EOS"):
        rescore([a], [[-1.0, -1.0, -1.0]])
