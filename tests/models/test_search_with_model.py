"""Beam search on a real (random) Seq2Seq: batched == one at a time; greedy == beam 1 argmax."""

import dataclasses

import pytest
import torch

from sanlab.decoding.search import beam_search, greedy_search
from tests_helpers import tiny_seq2seq


def _decode(model, src, *, beam, lp=1.0):
    max_lengths = torch.full((src.shape[0],), 9)
    return beam_search(model.decode_step, model.start_decoding(src), batch_size=src.shape[0], beam_size=beam,
                       bos=2, eos=3, pad=0, max_lengths=max_lengths, length_penalty=lp, n_best=beam)


@pytest.mark.parametrize("beam", [1, 4])
def test_batched_beam_equals_one_at_a_time(beam):
    model = tiny_seq2seq(eos_bias=True)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 50, (4, 8), generator=g)
    src[1, 3:] = 0
    src[2, 6:] = 0
    with torch.no_grad():
        batched = _decode(model, src, beam=beam)
        for b in range(4):
            length = int(src[b].ne(0).sum())
            alone = _decode(model, src[b:b + 1, :length], beam=beam)[0]
            assert [h.tokens for h in alone] == [h.tokens for h in batched[b]]
            for h1, h2 in zip(alone, batched[b]):
                assert h1.score == pytest.approx(h2.score, abs=1e-4)


def test_greedy_matches_argmax_of_the_model():
    model = tiny_seq2seq(eos_bias=True)
    src = torch.randint(4, 50, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hyp = greedy_search(model.decode_step, model.start_decoding(src), batch_size=1, bos=2, eos=3, pad=0,
                            max_lengths=torch.tensor([9]))[0][0]
        prefix = torch.tensor([[2]])
        tokens = []
        for _ in range(8):  # max length 9 counts the (forced) EOS
            logits = model(src, prefix)[0, -1]
            logits[[0, 2]] = float("-inf")  # PAD and BOS are never emitted
            nxt = int(logits.argmax())
            if nxt == 3:
                break
            tokens.append(nxt)
            prefix = torch.cat([prefix, torch.tensor([[nxt]])], dim=1)
    assert hyp.tokens == tokens


@pytest.mark.parametrize("beam", [1, 4])
def test_beam_scores_are_the_models_own_log_probs(beam):
    """Each hypothesis's positional scores are what one teacher-forced forward over BOS + its tokens gives
    (a cache reordered wrongly inside the model's layers would score another prefix)."""
    model = tiny_seq2seq(eos_bias=True)
    src = torch.randint(4, 50, (3, 7), generator=torch.Generator().manual_seed(3))
    src[2, 4:] = 0
    with torch.no_grad():
        for b, hyps in enumerate(_decode(model, src, beam=beam)):
            length = int(src[b].ne(0).sum())
            for h in hyps:
                target = torch.tensor([[2, *h.tokens]])  # BOS + tokens; the last position predicts EOS
                log_probs = torch.log_softmax(model(src[b:b + 1, :length], target)[0].float(), dim=-1)
                expected = log_probs[torch.arange(len(h.tokens) + 1), torch.tensor([*h.tokens, 3])]
                assert h.positional_scores == pytest.approx(expected.tolist(), abs=1e-4)
                assert h.log_prob == pytest.approx(float(expected.sum()), abs=1e-4)
                assert h.score == pytest.approx(h.log_prob / (len(h.tokens) + 1), abs=1e-4)


@dataclasses.dataclass(frozen=True)
class _Prefix:
    """An uncached search state: the source side and every token so far (the search reorders it as any cache)."""

    memory: torch.Tensor
    memory_valid: torch.Tensor
    tokens: torch.Tensor


@pytest.mark.parametrize("beam", [1, 5])
def test_the_cached_search_finds_what_a_search_without_cache_finds(beam):
    """``decode_step`` reuses each layer's keys and values; a step that runs the decoder again over the whole
    prefix at every step must find the same hypotheses in a batch of several sentences (a cache row that
    followed the wrong beam would change them)."""
    model = tiny_seq2seq(eos_bias=True)
    src = torch.randint(4, 50, (4, 8), generator=torch.Generator().manual_seed(0))
    src[1, 2:] = 0
    src[3, 5:] = 0

    def uncached(tokens, state):
        prefix = torch.cat([state.tokens, tokens], 1)
        logits, _ = model.decode(prefix, memory=state.memory, memory_valid=state.memory_valid)
        return torch.log_softmax(logits[:, -1].float(), dim=-1), _Prefix(state.memory, state.memory_valid, prefix)

    with torch.no_grad():
        cached = _decode(model, src, beam=beam)
        memory, memory_valid = model.encode(src)
        plain = beam_search(uncached, _Prefix(memory, memory_valid, src.new_zeros(4, 0)), batch_size=4,
                            beam_size=beam, bos=2, eos=3, pad=0, max_lengths=torch.full((4,), 9), n_best=beam)
    assert [[h.tokens for h in n] for n in cached] == [[h.tokens for h in n] for n in plain]
    assert [h.score for n in cached for h in n] == pytest.approx([h.score for n in plain for h in n], abs=1e-4)
    assert len({tuple(n[0].tokens) for n in cached}) > 1  # the sentences' outputs differ: a mixed-up row would show
