"""Beam search on a real (random) Seq2Seq: batched == one at a time; greedy == beam 1 argmax."""

import dataclasses
import itertools

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


@pytest.mark.parametrize("max_len", [1, 2, 3])
def test_a_beam_wider_than_the_vocabulary_returns_every_output_of_unknown_only_sources(max_len):
    """Vocabulary 6 (PAD, UNK, BOS, EOS, two words; UNK may be emitted), beam 20, n-best 20: every output of at most
    max_len - 1 tokens comes back once (13 for max length 3, only the empty one for max length 1), best first, each
    scored by the model's own log-probs. The sources are an unknown-only sentence and the empty one (EOS), batched:
    each as it is alone."""
    model = tiny_seq2seq(vocab=6, eos_bias=True, seed=1)
    src = torch.tensor([[1, 1, 1, 3], [3, 0, 0, 0]])
    emitted = (1, 4, 5)
    expected = {(*t,) for n in range(max_len) for t in itertools.product(emitted, repeat=n)}
    with torch.no_grad():
        found = beam_search(model.decode_step, model.start_decoding(src), batch_size=2, beam_size=20, bos=2, eos=3,
                            pad=0, max_lengths=torch.full((2,), max_len), n_best=20)
        for b, hyps in enumerate(found):
            length = int(src[b].ne(0).sum())
            assert [tuple(h.tokens) for h in hyps] and {tuple(h.tokens) for h in hyps} == expected
            assert len(hyps) == len(expected)  # each once
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
            for h in hyps:
                log_probs = torch.log_softmax(model(src[b:b + 1, :length], torch.tensor([[2, *h.tokens]]))[0], -1)
                assert h.log_prob == pytest.approx(float(log_probs[torch.arange(len(h.tokens) + 1),
                                                                   torch.tensor([*h.tokens, 3])].sum()), abs=1e-4)
            (alone,) = beam_search(model.decode_step, model.start_decoding(src[b:b + 1, :length]), batch_size=1,
                                   beam_size=20, bos=2, eos=3, pad=0, max_lengths=torch.tensor([max_len]), n_best=20)
            assert [h.tokens for h in alone] == [h.tokens for h in hyps]
