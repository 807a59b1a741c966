"""Decoding reads nothing on the host inside a model's step, and the search reads once per step.

On a GPU, every read of a tensor's value on the host (``bool(t)``, ``.tolist()``, ``.nonzero()``, boolean
indexing) waits until the device has run everything queued before it, and the device idles while Python
prepares what comes next. ``HostReads`` records those operations on the CPU, where they are free, so these
tests hold on CI. What they cannot see: code that runs only on CUDA (the FlexAttention plans; a GPU test,
``tests/gpu/test_cuda.py``, counts real syncs there) and copies made with ``.to(device)``.
"""

import pytest
import torch

from sanlab.attention.registry import PARTS
from sanlab.config import Seq2SeqConfig, StackConfig
from sanlab.errors import ConfigError
from sanlab.decoding.search import beam_search
from sanlab.layers.mixers import MIXERS
from sanlab.models.builders import build_seq2seq
from decoder_forms import build_or_skip_refused
from tests_helpers import HostReads, perturb, spy_plans

DIM, HEADS, VOCAB = 16, 4, 30
PLAIN = {"heads": HEADS}


def _model(decoder: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(dim=DIM, dropout=0.0, encoder=StackConfig(layers=2, ffn_dim=32),
                        decoder=StackConfig(layers=2, ffn_dim=32, **decoder), max_positions=32)
    return perturb(build_seq2seq(cfg, vocab_size=VOCAB, pad_id=0)).eval()


def _source() -> torch.Tensor:
    src = torch.randint(4, VOCAB, (3, 9), generator=torch.Generator().manual_seed(1))
    src[1, 6:] = 0
    return src


DECODERS = [pytest.param({}, id="vanilla")]
DECODERS += [pytest.param({side: {"heads": HEADS, "parts": [cfg.model_dump()]}}, id=f"{name}-{n}-{side}")
             for name in PARTS.names() for n, cfg in enumerate(PARTS.entry(name).config.examples())
             for side in ("attention", "cross_attention")]
DECODERS += [pytest.param({"mixer": {"type": name}}, id=f"mixer-{name}")
             for name in MIXERS.names() if name not in ("attention", "block")]  # block is encoder-only
# the banded plan (taken by `auto` from 128 keys on, beyond these short steps): its layout from the positions
DECODERS += [pytest.param({"attention": {"heads": HEADS, "plan": "banded", "parts": [cfg.model_dump()]}},
                          id=f"{name}-banded") for name in ("window", "csan2d")
             for cfg in PARTS.entry(name).config.examples()[:1]]


@pytest.mark.parametrize("decoder", DECODERS)
def test_a_decoder_step_reads_nothing_on_the_host(decoder):
    model = build_or_skip_refused(_model, decoder)
    tokens = torch.randint(4, VOCAB, (3, 4), generator=torch.Generator().manual_seed(2))
    reads = HostReads()
    with torch.no_grad(), spy_plans() as ran:
        state = model.start_decoding(_source())
        for t in range(tokens.shape[1]):  # the first step and the cached ones
            with reads:
                _, state = model.decode_step(tokens[:, t:t + 1], state)
    assert reads.reads() == []
    plan = decoder.get("attention", {}).get("plan")
    assert plan is None or plan in ran, f"the steps never ran plan {plan}: the reads checked were another plan's"


def test_beam_search_over_a_model_reads_the_host_once_per_step():
    model = _model({})
    reads = HostReads()

    def step(tokens, state):
        reads.mark()
        return model.decode_step(tokens, state)

    with torch.no_grad(), reads:
        hyps = beam_search(step, model.start_decoding(_source()), batch_size=3, beam_size=4, bos=2, eos=3, pad=0,
                           max_lengths=torch.tensor([6, 11, 8]), n_best=4)
    segments = " ".join(reads.events).split("step")
    assert len(segments) - 1 >= 6 and all(h for h in hyps)
    assert all(s.split() == ["tolist"] for s in segments[1:-1]), segments  # between two steps: one read


ENCODERS = [pytest.param({}, id="vanilla")]
ENCODERS += [pytest.param({"attention": {"heads": HEADS, "parts": [cfg.model_dump()]}}, id=f"{name}-{n}")
             for name in PARTS.names() for n, cfg in enumerate(PARTS.entry(name).config.examples())]
ENCODERS += [pytest.param({"mixer": cfg.model_dump()}, id=f"mixer-{name}-{n}")
             for name in MIXERS.names() for n, cfg in enumerate(MIXERS.entry(name).config.examples())]


@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu-paths", "accelerator-paths"])
@pytest.mark.parametrize("encoder", ENCODERS)
def test_a_training_forward_and_backward_reads_the_host_at_most_once(encoder, accelerator, monkeypatch):
    """Issue 24: a training update never waits for the device (tests/training/test_train_records.py checks the
    vanilla update). Each encoder form, over a padded batch: nothing read, but Block's automatic block length
    (Bi-BloSA's r over the batch's longest sentence: a shape, so a host read), read once per forward, not once
    per layer (every layer waited for the device on a GPU). Also through the paths a layer takes on an
    accelerator only (Block's two directions at once)."""
    from sanlab.layers import block_attention

    monkeypatch.setattr(block_attention, "directions_together", lambda device: accelerator)
    torch.manual_seed(0)
    try:
        cfg = Seq2SeqConfig(dim=DIM, dropout=0.1, encoder=StackConfig(layers=3, ffn_dim=32, **encoder),
                            decoder=StackConfig(layers=2, ffn_dim=32), max_positions=32)
        model = build_seq2seq(cfg, vocab_size=VOCAB, pad_id=0).train()
    except (ValueError, ConfigError) as err:  # a form refused in this stack
        pytest.skip(str(err))
    tgt = torch.randint(4, VOCAB, (3, 7), generator=torch.Generator().manual_seed(2))
    tgt[2, 5:] = 0
    reads = HostReads()
    with reads:
        model(_source(), tgt).float().sum().backward()
    mixer = encoder.get("mixer", {})
    auto_block = mixer.get("type") == "block" and mixer.get("block_len") == "auto" and mixer.get("block_mode") != "reference"
    assert reads.reads() == (["__int__"] if auto_block else [])
