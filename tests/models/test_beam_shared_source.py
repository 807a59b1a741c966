"""Beam search leaves the source side in place while no sentence leaves, and decodes bit for bit as with a full reorder.

Every beam of a sentence holds the same rows of the encoder output, its mask and the cross-attention keys and
values (``beam_shared_fields`` of ``DecodeState`` and ``SourceKV``), so ``reorder(..., within_sentences=True)``
keeps them instead of copying them. Here every decoder-side form (each attention part in the decoder's
self-attention and in its cross-attention, each mixer, MUSE's parallel block) decodes a batch whose sentences leave
at different steps, once so and once with every step's cache reordered whole: the hypotheses, scores and
positional scores must be identical.
"""

import pytest
import torch

import sanlab.decoding.search as search
from sanlab.attention.registry import PARTS
from sanlab.attention.state import SourceKV
from sanlab.config import Seq2SeqConfig, StackConfig
from sanlab.layers.mixers import MIXERS
from sanlab.models.builders import build_seq2seq
from decoder_forms import build_or_skip_refused
from tests_helpers import perturb, reorder_whole_caches

DIM, HEADS, VOCAB = 16, 4, 30
PLAIN = {"attention": {"heads": HEADS}}


def _decoder_forms() -> list:
    forms = []
    for name in PARTS.names():
        for n, cfg in enumerate(PARTS.entry(name).config.examples()):
            attention = {"heads": HEADS, "parts": [cfg.model_dump()]}
            forms.append(pytest.param({"attention": attention}, id=f"self-{name}-{n}"))
            forms.append(pytest.param({**PLAIN, "cross_attention": attention}, id=f"cross-{name}-{n}"))
    for name in MIXERS.names():
        if name not in ("attention", "block"):  # block attention is encoder-only
            forms.append(pytest.param({"mixer": {"type": name}}, id=f"mixer-{name}"))
    return forms


def _model(decoder: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(dim=DIM, dropout=0.0, encoder=StackConfig(layers=2, ffn_dim=32, **PLAIN),
                        decoder=StackConfig(layers=2, ffn_dim=32, **decoder), max_positions=16)
    return perturb(build_seq2seq(cfg, vocab_size=VOCAB, pad_id=0)).eval()


def _decode(model: torch.nn.Module, step=None) -> list:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (3, 9), generator=g)
    src[1, 6:] = 0
    with torch.no_grad():  # max lengths (EOS included): the sentences leave after step 3, 5 and 7 at the latest
        return search.beam_search(step or model.decode_step, model.start_decoding(src), batch_size=3, beam_size=3,
                                  bos=2, eos=3, pad=0, max_lengths=torch.tensor([4, 6, 8]), n_best=3)


@pytest.mark.parametrize("decoder", _decoder_forms())
def test_leaving_the_source_in_place_decodes_as_a_full_reorder(decoder, monkeypatch):
    model = build_or_skip_refused(_model, decoder)
    kept = _decode(model)
    reorder_whole_caches(monkeypatch)
    full = _decode(model)
    assert [[(h.tokens, h.score, h.log_prob, h.positional_scores) for h in hyps] for hyps in kept] == \
           [[(h.tokens, h.score, h.log_prob, h.positional_scores) for h in hyps] for hyps in full]


def _source_tensors(state) -> list:
    """The tensors a decoding state holds from the source: the encoder output, its mask, and the keys and values
    of every cross-attention cache (kept, not their ids, which a freed tensor's successor could take)."""
    found = [state.memory, state.memory_valid]

    def walk(x):
        if isinstance(x, SourceKV):
            found.extend([x.k, x.v])
        elif isinstance(x, (list, tuple)):
            for item in x:
                walk(item)
        elif hasattr(x, "__dataclass_fields__"):
            for name in x.__dataclass_fields__:
                walk(getattr(x, name))

    walk(state.layers)
    return found


@pytest.mark.parametrize("decoder", [pytest.param(PLAIN, id="vanilla"), pytest.param({"mixer": {"type": "muse"}},
                                                                                      id="muse")])
def test_the_source_is_copied_only_when_a_sentence_leaves(decoder):
    model = _model(decoder)
    seen = []  # per step: the rows decoded and the source tensors the step receives

    def step(tokens, state):
        if state.layers is not None:
            seen.append((tokens.shape[0], _source_tensors(state)))
        log_probs, state = model.decode_step(tokens, state)
        return log_probs - 1e4 * (torch.arange(VOCAB) == 3), state  # EOS only where forced: at the max length

    _decode(model, step)
    rows = [n for n, _ in seen]
    assert rows == [9, 9, 9, 6, 6, 3, 3]  # steps 1-7 (step 0 has no cache yet); sentences leave after steps 3 and 5
    assert len(seen[0][1]) == 2 + 2 * 2  # memory, its mask, and k, v of two layers' cross-attention
    for (n_before, before), (n_after, after) in zip(seen, seen[1:]):
        same = [a is b for a, b in zip(before, after)]
        assert all(same) if n_before == n_after else not any(same)
