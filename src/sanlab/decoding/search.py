"""Batched beam search and greedy search over a step function.

The search only sees ``step(tokens, cache) -> (log_probs, cache)`` and reorders the cache with
:func:`sanlab.decoding.cache.reorder`; it imports nothing from attention or models.

Notation: B sentences in the input batch, b <= B of them still live, k beams, N = b*k rows,
V vocabulary, t tokens emitted so far (BOS not counted).

The rules, those of fairseq's ``SequenceGenerator`` with every tie and edge case fixed:

* Each step ranks the k*V continuations of a sentence by cumulative log-prob and takes the best
  2k; ties go to the lower beam, then to the lower token id (``torch.topk`` leaves them open).
* A continuation ending in EOS that ranks among the best k finishes a hypothesis. EOS ranked
  k+1..2k is dropped: k live continuations beat it, and this makes ``beam_size=1`` exactly greedy.
* The best k continuations that do not end in EOS stay live.
* **Stopping:** a sentence is done as soon as it has k finished hypotheses (when more finish at
  the same step, the surplus, all of the same length, is dropped worst first), or when it
  reaches its max length (EOS is forced there, so every live hypothesis finishes), or when no
  live hypothesis has a finite score. Done sentences leave the batch: their rows are dropped
  from the cache, so later steps run on fewer rows. While none leaves, every row continues a row of
  its own sentence, so what all beams of a sentence share (the source side: the cache's
  ``beam_shared_fields``) stays where it is (``reorder(..., within_sentences=True)``); with one beam
  (greedy) every row continues itself, and the cache is not reordered at all.
* Hypotheses are ranked by the length-normalised score; ties keep the order of finishing.

Masking does not renormalise: PAD and BOS are never chosen, EOS is banned while fewer than
``min_length`` tokens were emitted, and at the max length every token but EOS is banned; the
chosen token keeps the log-prob the model gave it. Every decision of a sentence depends only on
its own rows, so (given a step function that treats rows independently) its result does not
depend on the other sentences in the batch. (One mixer does not: Block attention with
``block_len: auto`` takes its block length from the batch's longest sentence; docs/variants.md.)

**One host read per step.** On a GPU every read of a tensor's value on the host (``bool(t)``,
``.tolist()``, ``.nonzero()``, boolean indexing) waits for the device to finish its queue, and the
device then idles while Python prepares the next step. So the search keeps its bookkeeping on the
device: finished hypotheses are written into preallocated tensors by index (``_Finished``), the
top-k's ties are broken by a second ``topk`` over integer keys instead of ``nonzero``, and each step
copies one small vector to the host: which sentences are done, whether the step returned NaN or +inf, and whether
any hypothesis finished (only then are the finished ones written: most steps finish none). The hypotheses are read
once, at the end. (``tests/decoding/test_beam_search.py`` counts these reads.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
from torch import LongTensor, Tensor

from sanlab.decoding.cache import expand_for_beams, reorder

StepFn = Callable[[LongTensor, Any], tuple[Tensor, Any]]
"""``step(tokens, cache) -> (log_probs, cache)``: ``tokens`` [N, 1] is the last token of each
hypothesis (BOS at the first step), ``log_probs`` [N, V] the normalised log-probabilities of the
next token (any float dtype: the scores are kept in it, or in float32 if it is narrower), and the
returned cache the updated one (batch on dim 0 of every tensor)."""

LENGTH_PENALTY_STYLES = ("fairseq", "gnmt")


@dataclass(frozen=True)
class Hypothesis:
    """One finished output.

    ``tokens`` excludes BOS and EOS; ``log_prob`` is the sum of the token log-probs including
    EOS; ``score`` is ``log_prob`` divided by the length penalty of ``len(tokens) + 1`` and is
    what hypotheses are ranked by; ``positional_scores`` are the log-probs of the tokens then EOS.
    """

    tokens: list[int]
    score: float
    log_prob: float
    positional_scores: list[float]


@dataclass(frozen=True)
class _Beams:
    """The live hypotheses of the b live sentences, k rows each."""

    sentence: Tensor  # [b] index of each live sentence in the input batch
    max_len: Tensor  # [b] its max output length (tokens, EOS included)
    scores: Tensor  # [b, k] cumulative log-prob of each hypothesis (-inf: not live)
    tokens: Tensor  # [N, 1+t] BOS then the emitted tokens
    token_lp: Tensor  # [N, t] log-prob of each emitted token


@dataclass(frozen=True)
class _Candidates:
    """The best 2k continuations of each live sentence, best first."""

    scores: Tensor  # [b, 2k] cumulative log-prob
    beam: Tensor  # [b, 2k] beam it continues
    token: Tensor  # [b, 2k] token it appends


def beam_search(
    step: StepFn,
    cache: Any,
    *,
    batch_size: int,
    beam_size: int,
    bos: int,
    eos: int,
    pad: int,
    max_lengths: Tensor,
    length_penalty: float = 1.0,
    length_penalty_style: str = "fairseq",
    n_best: int = 1,
    min_length: int = 0,
) -> list[list[Hypothesis]]:
    """Beam search for ``batch_size`` sentences; per sentence, at most ``n_best`` hypotheses, best first.

    ``cache`` holds the batch of B sentences (it is expanded to B*k rows here). ``max_lengths``
    [B] is the max output length of each sentence, BOS excluded and EOS included. Length
    penalty of an output of ``L`` tokens (EOS included): ``L ** alpha`` ("fairseq") or
    ``((5 + L) / 6) ** alpha`` ("gnmt"), with ``alpha = length_penalty``. The rules, the
    stopping criterion included, are in the module docstring. Fewer than ``n_best`` come back
    only when fewer hypotheses with a finite score exist.
    """
    _check_arguments(batch_size=batch_size, beam_size=beam_size, eos=eos, pad=pad, max_lengths=max_lengths,
                     style=length_penalty_style, n_best=n_best, min_length=min_length)
    k = beam_size
    penalty = _penalty_fn(length_penalty, length_penalty_style)
    # 1. Give every sentence k rows; only beam 0 is live at first, so the beams do not start as k copies.
    cache = expand_for_beams(cache, k)
    beams = _start(batch_size=batch_size, k=k, bos=bos, max_lengths=max_lengths)
    live_max = max_lengths.tolist()  # the live sentences' max lengths, mirrored on the host
    longest = max(live_max)
    finished: _Finished | None = None
    banned: _Banned | None = None
    ranks: _Ranks | None = None
    for t in range(longest):
        # 2. Score the next token of every row: [N, V], masked by min and max length.
        log_probs, cache = step(beams.tokens[:, -1:], cache)
        _check_log_probs_shape(log_probs, rows=beams.tokens.shape[0], ids=(bos, eos, pad))
        valid = _no_nan_or_posinf(log_probs)  # read below, with `done`
        # the scores in the step's dtype, at least float32 (bf16 sums drift): widened once, at the first step
        log_probs = log_probs.to(torch.promote_types(log_probs.dtype, beams.scores.dtype))
        if banned is None:  # the vocabulary's size is known from the first step on
            beams = replace(beams, scores=beams.scores.to(log_probs.dtype), token_lp=beams.token_lp.to(log_probs.dtype))
            banned = _Banned.make(log_probs.shape[1], bos=bos, eos=eos, pad=pad, device=log_probs.device)
            ranks = _Ranks.make(batch_size=batch_size, k=k, vocab=log_probs.shape[1], device=log_probs.device)
        at_max = any(m <= t + 1 for m in live_max)
        log_probs = _restrict(log_probs, banned, t=t, max_len=beams.max_len.repeat_interleave(k) if at_max else None,
                              min_length=min_length)
        # 3. The best 2k continuations of each sentence over all its beams.
        candidates = _top_candidates(beams.scores, log_probs, ranks)
        # 4. An EOS among the best k finishes a hypothesis.
        if finished is None:  # its scores in the search's dtype
            finished = _Finished.empty(batch_size=batch_size, k=k, max_len=longest, dtype=log_probs.dtype,
                                       device=max_lengths.device)
        hits, counts = finished.hits_and_counts(beams, candidates, eos=eos)
        # 5. The best k non-EOS continuations stay live: [b, k].
        scores, rows, tokens = _live_choice(candidates, ranks, eos=eos)
        # 6. Done sentences leave the batch; the rows of the others follow their live hypotheses. (A score is a sum
        #    of log-probabilities, each <= 0: finite or -inf, as a NaN or +inf in the step's stops the search below.)
        done = (counts >= k) | (beams.max_len <= t + 1) | (scores.amax(1) == float("-inf"))
        flags = torch.cat([done, valid.view(1), hits.any().view(1)])
        *done_now, step_valid, any_hit = flags.tolist()  # the step's one host read
        if not step_valid:
            raise ValueError("step returned NaN or +inf log-probabilities")
        if any_hit:  # (most steps finish nothing: their writes, a dozen kernels on a GPU, are skipped)
            finished.add(beams, candidates, log_probs, hits, counts, t=t, eos=eos, ranks=ranks)
        if all(done_now):
            break
        kept = None
        if any(done_now):  # the live sentences in order: a stable sort, which needs no host read
            kept = done.to(torch.int8).argsort(stable=True)[:done_now.count(False)]
            live_max = [m for m, gone in zip(live_max, done_now) if not gone]
        beams, index = _next_beams(beams, log_probs, scores=scores, rows=rows, tokens=tokens, kept=kept)
        # 7. The cache follows the surviving rows; while no sentence leaves, every row stays within its sentence,
        #    so the rows all its beams share (the source side) need no copy, and with one beam nothing moves.
        if kept is not None or k > 1:
            cache = reorder(cache, index, within_sentences=kept is None)
    assert finished is not None  # max_lengths >= 1, so at least one step ran
    return finished.hypotheses(penalty=penalty, n_best=n_best)


def greedy_search(
    step: StepFn,
    cache: Any,
    *,
    batch_size: int,
    bos: int,
    eos: int,
    pad: int,
    max_lengths: Tensor,
    length_penalty: float = 1.0,
    length_penalty_style: str = "fairseq",
    min_length: int = 0,
) -> list[list[Hypothesis]]:
    """Greedy decoding: :func:`beam_search` with one beam (the argmax token at every step).

    The length penalty only sets the reported ``score``; it cannot change the output.
    """
    return beam_search(
        step, cache, batch_size=batch_size, beam_size=1, bos=bos, eos=eos, pad=pad, max_lengths=max_lengths,
        length_penalty=length_penalty, length_penalty_style=length_penalty_style, n_best=1, min_length=min_length,
    )


def rescore(hypotheses: list[Hypothesis], positional_scores: list[list[float]], *, length_penalty: float = 1.0,
            length_penalty_style: str = "fairseq") -> list[Hypothesis]:
    """The same outputs scored again: ``positional_scores[i]`` are the log-probs of ``hypotheses[i]``'s tokens
    then EOS under another model (or the same in another precision). Ranked by the new length-normalised score,
    best first; ties keep the given order."""
    if length_penalty_style not in LENGTH_PENALTY_STYLES:
        raise ValueError(f"length_penalty_style must be one of {LENGTH_PENALTY_STYLES}, got {length_penalty_style!r}")
    penalty = _penalty_fn(length_penalty, length_penalty_style)
    out = []
    for hypothesis, positional in zip(hypotheses, positional_scores, strict=True):
        if len(positional) != len(hypothesis.tokens) + 1:
            raise ValueError(f"{len(positional)} scores for {len(hypothesis.tokens)} tokens and EOS")
        out.append(_scored(hypothesis.tokens, list(positional), sum(positional), penalty))
    return sorted(out, key=lambda h: -h.score)


def _scored(tokens: list[int], positional: list[float], total: float, penalty: Callable[[int], float]) -> Hypothesis:
    """A hypothesis with its log-prob ``total`` and its score, normalised by the penalty of tokens + EOS."""
    return Hypothesis(tokens=tokens, score=total / penalty(len(tokens) + 1), log_prob=total,
                      positional_scores=positional)


def _check_arguments(*, batch_size: int, beam_size: int, eos: int, pad: int, max_lengths: Tensor, style: str,
                     n_best: int, min_length: int) -> None:
    if batch_size < 1 or beam_size < 1:
        raise ValueError(f"batch_size and beam_size must be >= 1, got {batch_size} and {beam_size}")
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and beam_size={beam_size}, got {n_best}")
    if style not in LENGTH_PENALTY_STYLES:
        raise ValueError(f"length_penalty_style must be one of {LENGTH_PENALTY_STYLES}, got {style!r}")
    if eos == pad:
        raise ValueError(f"eos and pad must differ, both are {eos}")
    if min_length < 0:
        raise ValueError(f"min_length must be >= 0, got {min_length}")
    if max_lengths.dtype.is_floating_point or tuple(max_lengths.shape) != (batch_size,):
        raise ValueError(f"max_lengths must be an integer tensor of shape ({batch_size},), "
                         f"got {max_lengths.dtype} of shape {tuple(max_lengths.shape)}")
    if int(max_lengths.min()) <= min_length:
        raise ValueError(f"every max length must exceed min_length={min_length} (room for EOS), "
                         f"got max_lengths={max_lengths.tolist()}")


def _check_log_probs_shape(log_probs: Tensor, *, rows: int, ids: tuple[int, ...]) -> None:
    if log_probs.dim() != 2 or log_probs.shape[0] != rows or log_probs.shape[1] <= max(ids):
        raise ValueError(f"step must return log_probs of shape [{rows}, V] with V > {max(ids)} "
                         f"(bos, eos, pad = {ids}), got {tuple(log_probs.shape)}")


def _no_nan_or_posinf(log_probs: Tensor) -> Tensor:
    """Whether ``log_probs`` holds no NaN and no +inf, as a device scalar, in one reduction and one comparison: the
    sum of values <= 0 is NaN or +inf exactly then (-inf entries, and a sum that overflows to -inf, are valid), and
    it is below +inf exactly otherwise (a NaN compares false)."""
    return log_probs.sum() < float("inf")


def _penalty_fn(alpha: float, style: str) -> Callable[[int], float]:
    if style == "fairseq":
        return lambda length: length**alpha
    return lambda length: ((5 + length) / 6) ** alpha


def _start(*, batch_size: int, k: int, bos: int, max_lengths: Tensor) -> _Beams:
    device = max_lengths.device
    scores = torch.full((batch_size, k), float("-inf"), device=device)  # [B, k]
    scores[:, 0] = 0.0
    return _Beams(
        sentence=torch.arange(batch_size, device=device),
        max_len=max_lengths.long(),
        scores=scores,
        tokens=torch.full((batch_size * k, 1), bos, dtype=torch.long, device=device),  # [N, 1]
        token_lp=scores.new_zeros((batch_size * k, 0)),  # [N, 0]
    )


@dataclass(frozen=True)
class _Ranks:
    """The integer keys every step ranks by, made once per search (an arange and arithmetic on it every step before:
    launches, on a GPU)."""

    tie_break: Tensor  # [k*V] width - position: of tied totals, the lower index first (``_top_k``)
    # the keys of a total above the n-th (2 * width) and below it (-1), as 0-d tensors: a Python number in
    # ``torch.where`` would be made a tensor, a launch on a GPU, at every step
    above: Tensor
    below: Tensor
    live: Tensor       # [2, 2k] a candidate's rank among its sentence's 2k: row 1 if it is EOS (non-EOS first)
    row_base: Tensor   # [B, 1] s * k: the first row of the s-th live sentence

    @staticmethod
    def make(*, batch_size: int, k: int, vocab: int, device: torch.device) -> _Ranks:
        width = k * vocab
        position = torch.arange(width, device=device, dtype=torch.int32 if width < 2**30 else torch.int64)
        candidates = torch.arange(2 * k, device=device)
        return _Ranks(tie_break=width - position, above=position.new_tensor(2 * width), below=position.new_tensor(-1),
                      live=torch.stack([candidates, candidates + 2 * k]),
                      row_base=torch.arange(batch_size, device=device).unsqueeze(1) * k)


@dataclass(frozen=True)
class _Banned:
    """The tokens a step may not choose, made once per search: each step bans them with one ``index_fill`` (a clone
    and a fill per symbol before: launches, on a GPU, at every step; a ``masked_fill`` with a [V] row would be one
    launch too, but 8 times slower on the CPU)."""

    always: Tensor   # ids of PAD and BOS (never a target; a model still gives them some mass)
    early: Tensor    # those and EOS: before ``min_length`` tokens
    not_eos: Tensor  # [V] every token but EOS: at a row's max length

    @staticmethod
    def make(vocab: int, *, bos: int, eos: int, pad: int, device: torch.device) -> _Banned:
        always = [pad] + ([bos] if bos != eos else [])  # fairseq-style vocabularies use one symbol for both
        return _Banned(always=torch.tensor(always, device=device), early=torch.tensor(always + [eos], device=device),
                       not_eos=torch.arange(vocab, device=device) != eos)


def _restrict(log_probs: Tensor, banned: _Banned, *, t: int, max_len: Tensor | None, min_length: int) -> Tensor:
    """Ban PAD and BOS, EOS before ``min_length`` tokens, and all but EOS in rows at their max length (``max_len``
    [N]; None when no row is there, which the caller knows on the host and which spares a pass over [N, V])."""
    out = log_probs.index_fill(1, banned.early if t < min_length else banned.always, float("-inf"))  # [N, V]
    if max_len is not None:
        force = (max_len <= t + 1).unsqueeze(1)  # [N, 1] the token chosen now is the last one allowed
        out.masked_fill_(force & banned.not_eos, float("-inf"))
    return out


def _top_candidates(scores: Tensor, log_probs: Tensor, ranks: _Ranks) -> _Candidates:
    b, k = scores.shape
    vocab = log_probs.shape[1]
    totals = (scores.unsqueeze(2) + log_probs.view(b, k, vocab)).view(b, k * vocab)  # [b, k*V]
    values, flat = _top_k(totals, 2 * k, ranks)  # [b, 2k]
    return _Candidates(scores=values, beam=flat // vocab, token=flat % vocab)


def _top_k(x: Tensor, n: int, ranks: _Ranks) -> tuple[Tensor, Tensor]:
    """The ``n`` largest entries of each row of ``x`` and their indices, best first.

    Ties go to the lower index, so the result is a function of the row alone (``torch.topk`` leaves them
    open). A first ``topk`` finds the n-th value; a second one, over integer keys, takes every entry above
    it and, of those equal to it, the lowest indices. No row is sorted whole and nothing is read on the host.
    The keys come from ``ranks`` (made for rows of ``x.shape[1]`` entries).
    """
    nth = x.topk(n, dim=1).values[:, -1:]  # [b, 1]
    key = torch.where(x > nth, ranks.above, torch.where(x == nth, ranks.tie_break, ranks.below))  # above > tied
    index = key.topk(n, dim=1).indices.sort(dim=1).values  # [b, n] ascending
    values, order = x.gather(1, index).sort(dim=1, descending=True, stable=True)
    return values, index.gather(1, order)


@dataclass(frozen=True)
class _Finished:
    """Up to k finished hypotheses per sentence, kept on the search's device and read once at the end.

    Slot ``s*k + j`` holds sentence ``s``'s ``j``-th hypothesis in the order they finished; one more
    row at the end takes the writes that are dropped, so every step writes without a host read.
    """

    count: Tensor  # [B] hypotheses finished so far (at most k)
    tokens: Tensor  # [B*k+1, T] emitted tokens (EOS excluded)
    length: Tensor  # [B*k+1] how many
    positional: Tensor  # [B*k+1, T] log-prob of each token, then of EOS
    total: Tensor  # [B*k+1] their sum (the cumulative log-prob the search ranked)

    @staticmethod
    def empty(*, batch_size: int, k: int, max_len: int, dtype: torch.dtype, device: torch.device) -> _Finished:
        rows = batch_size * k + 1
        return _Finished(
            count=torch.zeros(batch_size, dtype=torch.long, device=device),
            tokens=torch.zeros(rows, max_len, dtype=torch.long, device=device),
            length=torch.zeros(rows, dtype=torch.long, device=device),
            positional=torch.zeros(rows, max_len, dtype=dtype, device=device),
            total=torch.zeros(rows, dtype=dtype, device=device),
        )

    def hits_and_counts(self, beams: _Beams, cand: _Candidates, *, eos: int) -> tuple[Tensor, Tensor]:
        """Which of each live sentence's best k continuations end in EOS [b, k], and how many hypotheses each
        sentence will have once they are added [b] (at most k)."""
        k = beams.scores.shape[1]
        hits = (cand.token[:, :k] == eos) & (cand.scores[:, :k] > float("-inf"))  # [b, k] (finite or -inf)
        return hits, (self.count[beams.sentence] + hits.sum(1)).clamp_(max=k)

    def add(self, beams: _Beams, cand: _Candidates, log_probs: Tensor, hits: Tensor, counts: Tensor, *, t: int,
            eos: int, ranks: _Ranks) -> None:
        """Store the EOS continuations ``hits`` among the best k of each live sentence, while it has fewer than k
        (the rest, worse or later, are dropped); ``counts``: ``hits_and_counts``'s, what each count becomes."""
        b, k = beams.scores.shape
        before = self.count[beams.sentence]  # [b]
        slot = before.unsqueeze(1) + hits.long().cumsum(1) - 1  # [b, k] its place among the sentence's hypotheses
        dropped = self.count.shape[0] * k  # the extra row
        target = torch.where(hits & (slot < k), beams.sentence.unsqueeze(1) * k + slot, dropped).view(-1)
        rows = (ranks.row_base[:b] + cand.beam[:, :k]).view(-1)  # [b*k]
        self.tokens[target, :t] = beams.tokens[rows, 1:]
        self.length[target] = t
        self.positional[target, :t] = beams.token_lp[rows]
        self.positional[target, t] = log_probs[rows, eos]
        self.total[target] = cand.scores[:, :k].reshape(-1)
        self.count[beams.sentence] = counts

    def hypotheses(self, *, penalty: Callable[[int], float], n_best: int) -> list[list[Hypothesis]]:
        """Each sentence's best ``n_best``, ranked by the length-normalised score (ties: the earlier finished)."""
        k = (self.tokens.shape[0] - 1) // self.count.shape[0]
        count, tokens, length = self.count.tolist(), self.tokens.tolist(), self.length.tolist()
        positional, total = self.positional.tolist(), self.total.tolist()
        out = []
        for s, n in enumerate(count):
            found = []
            for row in range(s * k, s * k + n):
                m = length[row]
                found.append(_scored(tokens[row][:m], positional[row][:m + 1], total[row], penalty))
            out.append(sorted(found, key=lambda h: -h.score)[:n_best])
        return out


def _live_choice(cand: _Candidates, ranks: _Ranks, *, eos: int) -> tuple[Tensor, Tensor, Tensor]:
    """Scores, source rows and tokens of the best k non-EOS continuations: each [b, k].

    A sentence has one EOS continuation per beam, so at least k of its 2k candidates qualify.
    """
    b, two_k = cand.scores.shape
    k = two_k // 2
    rank = torch.where(cand.token == eos, ranks.live[1], ranks.live[0])  # [b, 2k] non-EOS first, then in order
    pick = rank.argsort(dim=1)[:, :k]  # [b, k]
    rows = ranks.row_base[:b] + cand.beam.gather(1, pick)
    return cand.scores.gather(1, pick), rows, cand.token.gather(1, pick)


def _next_beams(beams: _Beams, log_probs: Tensor, *, scores: Tensor, rows: Tensor, tokens: Tensor,
                kept: Tensor | None) -> tuple[_Beams, Tensor]:
    """The live hypotheses of the ``kept`` sentences (None: all), and the old row each new row continues [N'].
    (With every sentence kept, the per-sentence tensors are taken as they are: an identity gather of each would be
    one more copy, and on a GPU one more kernel launch, every step.)"""
    if kept is not None:
        beams = replace(beams, sentence=beams.sentence[kept], max_len=beams.max_len[kept])
        scores, rows, tokens = scores[kept], rows[kept], tokens[kept]
    index = rows.reshape(-1)  # [N']
    new = tokens.reshape(-1, 1)  # [N', 1]
    return _Beams(
        sentence=beams.sentence,
        max_len=beams.max_len,
        scores=scores,
        tokens=torch.cat([beams.tokens[index], new], 1),  # [N', 2+t]
        token_lp=torch.cat([beams.token_lp[index], log_probs[index].gather(1, new)], 1),  # [N', 1+t]
    ), index
