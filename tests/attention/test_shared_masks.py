"""Masks made once per ``Positions`` and shared by every call over them (``Positions.once``).

The layers of an encoder (and the cross-attentions of a decoding step) attend over the same positions: the
boolean mask the fused kernel takes, the dense plan's visibility mask with its complements, the float
query mask and Rel_Pos's relative index are made at the first call and read by the others. What must hold:
the shared mask is the one a fresh call makes (outputs equal), a mask depends on nothing the memo's key
leaves out (the float query mask's dtype is part of its key), no key names a size (dynamic compilation would
pin it), a part's own mask is never shared, and no copy of the positions inherits a memo.
"""

import dataclasses

import pytest
import torch

from sanlab.attention import Attention, Positions, plans
from sanlab.attention.build import build_attention
from sanlab.attention.config import AttentionConfig
from sanlab.attention.parts import rel_pos
from sanlab.registry import BuildContext
from sanlab.torch_release import TORCH
from sanlab.traceable import replace
from tests_helpers import spy_calls, spy_plans

B, HEADS, DIM, LENGTH = 3, 4, 16, 6


def _valid(lengths) -> torch.Tensor:
    return torch.arange(LENGTH)[None] < torch.tensor(lengths)[:, None]  # [b, j]


def _layers(n, *, plan="auto", parts=None, side="encoder"):
    torch.manual_seed(0)
    if parts is None:
        return [Attention(dim=DIM, heads=HEADS, plan=plan).eval() for _ in range(n)]
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=0, num_layers=n, side=side, max_len=64)
    return [build_attention(AttentionConfig(heads=HEADS, plan=plan, parts=parts), ctx).eval() for _ in range(n)]


def _run(layers, x, positions):
    outs = []
    for layer in layers:  # the same input to every layer: each output must equal a call with fresh positions
        outs.append(layer(x, positions=positions).output)
    return outs


def _fresh(layers, x, make_positions):
    return [layer(x, positions=make_positions()).output for layer in layers]


POSITIONS = {
    "encoder-padded": lambda: Positions.self_attention(_valid((6, 4, 1)), length=LENGTH),
    "decoder-padded": lambda: Positions.self_attention(_valid((6, 4, 1)), length=LENGTH, causal=True),
    "cross-padded": lambda: Positions.cross_attention(Positions.self_attention(None, length=LENGTH), _valid((6, 0, 2)),
                                                      memory_length=LENGTH),
}


@pytest.mark.parametrize("plan", ["sdpa", "dense"])
@pytest.mark.parametrize("case", POSITIONS)
def test_three_layers_over_the_same_positions_make_the_mask_once_and_equal_fresh_calls(case, plan):
    layers, x = _layers(3, plan=plan), torch.randn(B, LENGTH, DIM)
    want = _fresh(layers, x, POSITIONS[case])
    mask_maker = "visibility" if plan == "dense" or case == "decoder-padded" else "_padding_mask"
    with spy_calls(plans, mask_maker) as made, spy_calls(torch.Tensor, "to") as query_masks, spy_plans() as ran:
        got = _run(layers, x, POSITIONS[case]())
    assert ran == [plan] * 3
    assert len(made) == 1, f"{plan}: the mask was made {len(made)} times for 3 layers"
    # the float query mask: once where queries are padded (self-attention), never where they are not (cross here)
    assert len(query_masks) == (0 if case == "cross-padded" else 1), f"{len(query_masks)} conversions for 3 layers"
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_the_kernels_mask_serves_every_dtype_and_the_query_mask_is_made_per_dtype():
    """The fused kernel's mask stays boolean (torch makes each backend's additive form); the float query mask is
    made per dtype."""
    layer, positions = _layers(1, plan="sdpa")[0], POSITIONS["encoder-padded"]()
    x = torch.randn(B, LENGTH, DIM)
    with spy_calls(plans, "_padding_mask") as made:
        fp32 = layer(x, positions=positions).output
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = layer(x, positions=positions).output
            fresh = layer(x, positions=POSITIONS["encoder-padded"]()).output
    assert len(made) == 2  # once for fp32 and bf16 over the same positions, then the fresh positions' own
    assert fp32.dtype == torch.float32 and bf16.dtype == torch.bfloat16 and torch.equal(bf16, fresh)
    assert {key[1] for key in positions.derived if key[0] == "query mask"} == {torch.float32, torch.bfloat16}


def test_the_memo_adds_no_recompile_to_a_dynamically_compiled_model(monkeypatch):
    """A size in a memo's key would pin the shapes under dynamic compilation: a recompile per batch shape (the
    decoder's causal, padded self-attention reads such a memo). torch 2.13 compiles the model once for three
    shapes; torch 2.5 pins the source length by itself, so there it is compared with the same model without the
    memo (3 graphs either way)."""
    import torch._dynamo

    from sanlab.config import validate
    from sanlab.models.builders import build_seq2seq

    stack = {"layers": 1, "ffn_dim": 32, "attention": {"heads": 2}}
    config = validate({"task": "translation", "data": {"train": {"src": "x", "tgt": "y"},
                                                        "valid": {"src": "x", "tgt": "y"}},
                       "model": {"dim": 16, "dropout": 0.0, "encoder": stack, "decoder": stack}}, source="test")
    torch.manual_seed(0)
    model = build_seq2seq(config.model, vocab_size=30, pad_id=0).eval()

    def graphs() -> int:
        made = []

        def backend(graph, example_inputs):
            made.append(graph)
            return graph.forward

        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend, dynamic=True)
        for b, s, t in [(3, 9, 7), (4, 16, 12), (5, 24, 20)]:  # no two sizes alike (dynamo pairs equal sizes)
            src, tgt = torch.randint(1, 30, (b, s)), torch.randint(1, 30, (b, t))
            src[0, -2:], tgt[1, -3:] = 0, 0  # padded on both sides
            with torch.no_grad():
                torch.testing.assert_close(compiled(src, tgt), model(src, tgt))
        return len(made)

    with_memo = graphs()
    if TORCH >= (2, 13):  # the project's torch (checked on 2.5.1 and 2.13.0 only): one graph, the fewest there
        assert with_memo == 1  # can be, so the memo-less compile (half this test's time) would add nothing
        return
    with monkeypatch.context() as patch:
        patch.setattr(Positions, "once", lambda self, key, make, **_: make())  # no memo
        without = graphs()
    assert with_memo == without, f"{with_memo} graphs for 3 batch shapes, {without} without the memo"


def test_a_parts_own_mask_is_made_at_every_call():
    layers = _layers(3, plan="dense", parts=[{"type": "window", "half_width": 1, "layers": None}])
    with spy_calls(plans, "visibility") as made:
        _run(layers, torch.randn(B, LENGTH, DIM), POSITIONS["encoder-padded"]())
    assert len(made) == 3  # a window part's mask may depend on more than the positions: never shared


def test_rel_pos_makes_its_relative_index_once_per_positions():
    layers = [layer.double() for layer in _layers(3, parts=[{"type": "rel_pos", "max_distance": 2}])]
    x = torch.randn(B, LENGTH, DIM, dtype=torch.float64)
    want = _fresh(layers, x, POSITIONS["encoder-padded"])
    with spy_calls(rel_pos, "relative_index") as made:
        got = _run(layers, x, POSITIONS["encoder-padded"]())
    assert len(made) == 1  # the score and the value term of 3 layers: one index
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_the_constructors_give_a_memo_and_no_copy_inherits_it():
    positions = POSITIONS["encoder-padded"]()
    assert positions.derived is not None
    assert positions.once("k", lambda: 1) == 1 and positions.once("k", lambda: 2) == 1
    for copy in (replace(positions, key_valid=_valid((6, 6, 6))), dataclasses.replace(positions),
                 Positions(q_pos=positions.q_pos, k_pos=positions.k_pos, key_valid=positions.key_valid)):
        assert copy.derived is None
        assert copy.once("k", lambda: 2) == 2 and copy.once("k", lambda: 3) == 3  # no memo: made at every call


def test_decoding_steps_over_one_memory_make_its_key_mask_once_and_again_when_rows_leave():
    """The cross-attention's key-padding mask depends on the memory alone: ``DecodeState.memory_keys`` carries it
    from step to step (every cross-attention of every step reads one), and a reorder that drops a sentence (a new
    ``memory_valid``) makes it anew. The steps decode what steps without the carried keys decode, bit for bit;
    Rel_Pos in the cross-attention, whose index depends on the step's query position, still makes it per step."""
    from sanlab.config import Seq2SeqConfig, StackConfig
    from sanlab.decoding.cache import reorder
    from sanlab.models.builders import build_seq2seq

    def model(cross_parts):
        torch.manual_seed(0)
        stack = StackConfig(layers=2, ffn_dim=32, attention={"heads": 2},
                            cross_attention={"heads": 2, "parts": cross_parts})
        cfg = Seq2SeqConfig(dim=16, dropout=0.0, encoder=StackConfig(layers=1, ffn_dim=32, attention={"heads": 2}),
                            decoder=stack, max_positions=32)
        return build_seq2seq(cfg, vocab_size=30, pad_id=0).double().eval()

    src = torch.randint(4, 30, (3, 7), generator=torch.Generator().manual_seed(1))
    src[1, 4:], src[2, 2:] = 0, 0

    def decode(model, *, carried):
        state, outputs = model.start_decoding(src), []
        tokens = torch.full((3, 1), 1)
        with torch.no_grad():
            for t in range(4):
                if not carried:
                    state = dataclasses.replace(state, memory_keys=None)
                log_probs, state = model.decode_step(tokens, state)
                outputs.append(log_probs)
                tokens = log_probs.argmax(-1, keepdim=True)
                if t == 1:  # sentence 1 leaves
                    keep = torch.tensor([0, 2])
                    state, tokens = reorder(state, keep), tokens[keep]
        return outputs

    plain = model([])
    with spy_calls(plans, "_padding_mask") as made:
        carried = decode(plain, carried=True)
    assert len(made) == 1 + 2  # the encoder's, then steps 0 and 2: two cross-attentions in four steps read two
    with spy_calls(plans, "_padding_mask") as made:
        fresh = decode(plain, carried=False)
    for got, want in zip(carried, fresh):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(made) == 1 + 4  # without the carried keys: one per step

    cross_rel_pos = model([{"type": "rel_pos", "max_distance": 2, "cross": True}])
    with spy_calls(rel_pos, "relative_index") as index:
        decode(cross_rel_pos, carried=True)
    assert len(index) == 4  # once per step (two cross-attentions read it)
