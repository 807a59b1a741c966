"""1D-/2D-CSAN parts (spec locality-variants.md A.8) on hand-written tiny cases.

Equality with the dense reference for the banded plan is in ``test_banded.py``; the generic
contracts (shapes, cache, no leak, padding) in ``test_contracts.py``.
"""

import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from sanlab.attention import Attention, AttentionContext, KeySet, Positions
from sanlab.attention.parts.csan2d import HeadArea, build_csan2d, head_sources
from sanlab.attention.parts.csan2d_config import Csan2dConfig
from sanlab.attention.parts.window import build_window
from sanlab.attention.parts.window_config import WindowConfig
from sanlab.config import load_config
from sanlab.models.builders import build_seq2seq, build_tagger, count_parameters
from sanlab.registry import BuildContext
from tests_helpers import spy_plans

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ENCODER = BuildContext(dim=16, heads=4, layer_index=0, num_layers=1, side="encoder", max_len=32)


def _mask(part, length: int, *, causal: bool = False) -> list[list[int]]:
    ctx = AttentionContext(positions=Positions.self_attention(None, length=length, causal=causal), heads=1,
                           head_dim=1)
    return part.mask(ctx)[0, 0].int().tolist()  # [i, j]


def test_window_3_on_length_5_is_the_hand_written_band():
    part = build_window(WindowConfig(size=3), ENCODER)
    assert _mask(part, 5) == [[1, 1, 0, 0, 0],
                              [1, 1, 1, 0, 0],
                              [0, 1, 1, 1, 0],
                              [0, 0, 1, 1, 1],
                              [0, 0, 0, 1, 1]]
    assert part.half_width == 1 and WindowConfig(half_width=1).m == 1 and WindowConfig().m == 5


def test_decoder_windows_half_and_full():
    half = build_window(WindowConfig(size=3), ENCODER)
    full = build_window(WindowConfig(size=3, causal_window="full"), ENCODER)
    assert _mask(half, 5, causal=True) == [[1, 0, 0, 0, 0],   # [i-m, i]
                                           [1, 1, 0, 0, 0],
                                           [0, 1, 1, 0, 0],
                                           [0, 0, 1, 1, 0],
                                           [0, 0, 0, 1, 1]]
    assert _mask(full, 5, causal=True) == [[1, 0, 0, 0, 0],   # [i-2m, i]: as many keys as the encoder
                                           [1, 1, 0, 0, 0],
                                           [1, 1, 1, 0, 0],
                                           [0, 1, 1, 1, 0],
                                           [0, 0, 1, 1, 1]]
    assert _mask(full, 5) == _mask(half, 5)  # the encoder window is the same in both modes


def test_extend_returns_the_keys_of_the_head_area_with_their_positions_and_head_map():
    part = HeadArea(half_width=1, area=3, boundary="clip")
    k = torch.arange(3.0)[None, :, None, None].expand(1, 3, 2, 1)  # [b, h, j, d]: each key holds its head
    valid = torch.tensor([[True, False]])
    keys = KeySet(k, -k, Positions.self_attention(valid, length=2))
    ctx = AttentionContext(positions=keys.positions, heads=3, head_dim=1)
    out = part.extend(keys, ctx)
    assert out.k.shape == (1, 3, 6, 1) and keys.k.shape == (1, 3, 2, 1)  # the input is left as it was
    assert out.k[0, 1, :, 0].tolist() == [0, 0, 1, 1, 2, 2] and torch.equal(out.v, -out.k)
    assert out.positions.k_pos.tolist() == [0, 1] * 3 and out.positions.key_valid.tolist() == [[True, False] * 3]
    assert torch.equal(out.positions.q_pos, keys.positions.q_pos)
    assert out.key_head.tolist() == [[-1, -1, 0, 0, 1, 1], [0, 0, 1, 1, 2, 2], [1, 1, 2, 2, -1, -1]]


def _identity_attention(part, *, dim: int, heads: int, k_scale: list[float] | None = None) -> Attention:
    """q = x, k = x * k_scale, v = x: the test can write the expected output by hand."""
    attn = Attention(dim=dim, heads=heads, parts=[part] if part else [], bias=False, out_proj=False,
                     plan="dense").double()
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            proj.weight.copy_(torch.eye(dim, dtype=torch.float64))
        if k_scale is not None:
            attn.k_proj.weight.copy_(torch.diag(torch.tensor(k_scale, dtype=torch.float64)))
    return attn


def test_window_output_at_one_query_by_hand():
    x = torch.tensor([[[1.0, 0.0], [0.5, 2.0], [-1.0, 1.0], [2.0, -0.5], [0.0, 3.0]]], dtype=torch.float64)
    attn = _identity_attention(build_window(WindowConfig(size=3), ENCODER), dim=2, heads=1)
    out = attn(x, positions=Positions.self_attention(None, length=5)).output
    # query 2 sees keys 1, 2, 3 only: softmax of x2 . xj / sqrt(2), then the weighted sum of xj
    q, keys = x[0, 2].tolist(), [x[0, j].tolist() for j in (1, 2, 3)]
    e = [math.exp((q[0] * k[0] + q[1] * k[1]) / math.sqrt(2)) for k in keys]
    expected = [sum(e[n] * keys[n][c] for n in range(3)) / sum(e) for c in range(2)]
    torch.testing.assert_close(out[0, 2], torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("plan", ["dense", "banded"])
@pytest.mark.parametrize("causal", [False, True])
def test_2d_with_one_head_equals_1d(plan, causal):
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    valid = torch.tensor([[True] * 9, [True] * 4 + [False] * 5])
    pos = Positions.self_attention(valid, length=9, causal=causal)
    one = Attention(dim=16, heads=4, parts=[build_window(WindowConfig(size=5), ENCODER)], plan=plan).double()
    two = Attention(dim=16, heads=4, parts=[build_csan2d(Csan2dConfig(size=5, heads_area=1), ENCODER)],
                    plan=plan).double()
    two.load_state_dict(one.state_dict())
    with spy_plans() as ran:
        torch.testing.assert_close(two(x, positions=pos).output, one(x, positions=pos).output)
    assert ran == [plan, plan]


@pytest.mark.parametrize("plan", ["dense", "banded"])
@pytest.mark.parametrize("config", [WindowConfig(size=13), WindowConfig(size=21),
                                    Csan2dConfig(size=13, heads_area=1)], ids=["1d-M=2I-1", "1d-M>2I-1", "2d-N=1"])
def test_window_covering_the_sentence_equals_vanilla_attention(config, plan):
    length = 7  # M >= 2I-1 = 13: every query sees every key
    x = torch.randn(3, length, 16, dtype=torch.float64)
    valid = torch.arange(length)[None, :] < torch.tensor([7, 5, 2])[:, None]
    pos = Positions.self_attention(valid, length=length)
    vanilla = Attention(dim=16, heads=4, plan="dense").double()
    part = build_window(config, ENCODER) if config.type == "window" else build_csan2d(config, ENCODER)
    local = Attention(dim=16, heads=4, parts=[part], plan=plan).double()
    local.load_state_dict(vanilla.state_dict())
    with spy_plans() as ran:
        torch.testing.assert_close(local(x, positions=pos).output, vanilla(x, positions=pos).output)
    assert ran == [plan, "dense"]


def test_head_sources_at_the_edges_of_three_heads():
    # slots delta = -1, 0, +1 of heads 0, 1, 2 (spec A.3 table)
    k, v, ok = head_sources(heads=3, area=3, boundary="wrap")
    assert k.tolist() == v.tolist() == [[2, 0, 1], [0, 1, 2], [1, 2, 0]] and ok.all()
    k, v, ok = head_sources(heads=3, area=3, boundary="clip")
    assert ok.tolist() == [[False, True, True], [True, True, True], [True, True, False]]
    assert k.tolist() == v.tolist()  # invalid slots hold some in-range head; they are masked
    k, v, ok = head_sources(heads=3, area=3, boundary="reference")
    assert k.tolist() == [[2, 0, 1], [0, 1, 2], [1, 2, 0]]   # keys wrap around ...
    assert v.tolist() == [[0, 0, 1], [0, 1, 2], [1, 2, 2]]   # ... values repeat the edge head
    assert ok.all()


def _softmax_sum(energies: list[float], values: list[float]) -> float:
    e = [math.exp(x) for x in energies]
    return sum(w * val for w, val in zip(e, values)) / sum(e)


@pytest.mark.parametrize("boundary", ["wrap", "clip", "reference"])
def test_edge_heads_of_a_hand_built_three_head_example(boundary):
    """One token, 3 heads of width 1: q^h = x_h, k^h = c_h x_h, v^h = x_h, energies q^h k^s (scale 1)."""
    x0, x1, x2 = 0.5, -1.0, 2.0
    c = [1.0, 3.0, -2.0]
    k = [c[0] * x0, c[1] * x1, c[2] * x2]
    v = [x0, x1, x2]
    part = build_csan2d(Csan2dConfig(size=1, heads_area=3, head_boundary=boundary), BuildContext(
        dim=3, heads=3, layer_index=0, num_layers=1, side="encoder", max_len=4))
    attn = _identity_attention(part, dim=3, heads=3, k_scale=c)
    x = torch.tensor([[[x0, x1, x2]]], dtype=torch.float64)  # [b=1, i=1, dim=3]
    out = attn(x, positions=Positions.self_attention(None, length=1)).output
    expected = {
        # head 0, slots delta = -1, 0, +1
        "wrap": [_softmax_sum([x0 * k[2], x0 * k[0], x0 * k[1]], [v[2], v[0], v[1]]),
                 _softmax_sum([x2 * k[1], x2 * k[2], x2 * k[0]], [v[1], v[2], v[0]])],
        "clip": [_softmax_sum([x0 * k[0], x0 * k[1]], [v[0], v[1]]),
                 _softmax_sum([x2 * k[1], x2 * k[2]], [v[1], v[2]])],
        # head 0 with delta = -1 scores k^2 but takes v^0; head 2 with delta = +1 scores k^0 but takes v^2
        "reference": [_softmax_sum([x0 * k[2], x0 * k[0], x0 * k[1]], [v[0], v[0], v[1]]),
                      _softmax_sum([x2 * k[1], x2 * k[2], x2 * k[0]], [v[1], v[2], v[2]])],
    }[boundary]
    middle = _softmax_sum([x1 * k[0], x1 * k[1], x1 * k[2]], [v[0], v[1], v[2]])  # head 1 is inside
    torch.testing.assert_close(out[0, 0], torch.tensor([expected[0], middle, expected[1]], dtype=torch.float64))


@pytest.mark.parametrize("boundary", ["wrap", "clip", "reference"])
def test_2d_padding_invariance(boundary):
    part = build_csan2d(Csan2dConfig(size=3, head_boundary=boundary), ENCODER)
    attn = Attention(dim=16, heads=4, parts=[part]).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    valid = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    out = attn(x, positions=Positions.self_attention(valid, length=5)).output
    longer = torch.cat([x, 9.0 * torch.ones(2, 3, 16, dtype=torch.float64)], dim=1)  # [b, 8, dim]
    longer_valid = torch.cat([valid, torch.zeros(2, 3, dtype=torch.bool)], dim=1)
    out_long = attn(longer, positions=Positions.self_attention(longer_valid, length=8)).output
    torch.testing.assert_close(out_long[:, :5][valid], out[valid])


@pytest.mark.parametrize("plan", ["dense", "banded"])
@pytest.mark.parametrize("config", [WindowConfig(size=3), WindowConfig(size=3, causal_window="full"),
                                    Csan2dConfig(size=3), Csan2dConfig(size=3, causal_window="full",
                                                                       head_boundary="reference")],
                         ids=["1d-half", "1d-full", "2d-half", "2d-full-reference"])
def test_decoder_cached_steps_equal_full_forward(config, plan):
    ctx = BuildContext(dim=16, heads=4, layer_index=0, num_layers=1, side="decoder", max_len=32)
    part = build_window(config, ctx) if config.type == "window" else build_csan2d(config, ctx)
    attn = Attention(dim=16, heads=4, parts=[part], plan=plan).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    full = attn(x, positions=Positions.self_attention(None, length=7, causal=True)).output
    cache, steps = None, []
    with spy_plans() as ran:
        for t in range(7):
            r = attn(x[:, t:t + 1], positions=Positions.self_attention(None, length=1, offset=t, causal=True),
                     cache=cache, use_cache=True)
            cache = r.cache
            steps.append(r.output)
    assert ran == [plan] * 7
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


@pytest.mark.parametrize("name, base, task", [
    ("multi30k-en-de-csan1d.yaml", "multi30k-en-de-transformer.yaml", "translation"),
    ("multi30k-en-de-csan2d.yaml", "multi30k-en-de-transformer.yaml", "translation"),
    ("ud-ewt-csan1d.yaml", "ud-ewt-tagger.yaml", "tagging"),
    ("ud-ewt-csan2d.yaml", "ud-ewt-tagger.yaml", "tagging")])
def test_recipes_add_no_parameters(name, base, task):
    def build(path):
        model = load_config(CONFIGS / path).model
        if task == "translation":
            return build_seq2seq(model, vocab_size=50, pad_id=0)
        return build_tagger(model, vocab_size=50, num_chars=20, num_tags=7)

    local, host = build(name), build(base)
    assert count_parameters(local) == count_parameters(host)
    parts = [type(p).__name__ for layer in local.encoder.layers for p in layer.mixer.parts]
    assert parts and set(parts) <= {"WindowMask", "HeadArea"}


def test_config_errors_name_the_values():
    with pytest.raises(ValidationError, match="must be odd and >= 1.*got 10"):
        WindowConfig(size=10)
    with pytest.raises(ValidationError, match="size 5 and half_width 1 disagree"):
        WindowConfig(size=5, half_width=1)
    with pytest.raises(ValidationError, match="heads_area N must be odd.*got 2"):
        Csan2dConfig(heads_area=2)
    with pytest.raises(ValueError, match="heads_area N = 5 exceeds the 4 heads"):
        build_csan2d(Csan2dConfig(heads_area=5), ENCODER)


@pytest.mark.parametrize("build, config", [(build_window, WindowConfig()), (build_csan2d, Csan2dConfig())])
def test_csan_refuses_cross_attention(build, config):
    ctx = BuildContext(dim=8, heads=4, layer_index=1, num_layers=2, side="cross", max_len=9)
    with pytest.raises(ValueError, match="not defined for cross-attention .cross layer 1"):
        build(config, ctx)


def test_csan_default_placement_is_the_lowest_three_layers():
    """Yang et al. localise the lowest 3 of 6 encoder layers; `layers: null` means every layer."""
    assert WindowConfig().layers == Csan2dConfig().layers == [0, 1, 2]
    assert [WindowConfig().applies_to(i) for i in range(6)] == [True] * 3 + [False] * 3
    assert WindowConfig(layers=None).applies_to(5)
