"""Contracts every registered attention part keeps, parametrised over the registry.

Each case is one part type x one of its config's ``examples()``, built with ``PARTS.build`` inside
a tiny ``Attention`` (width 16, 4 heads, float64, odd lengths, padding), on the encoder side and,
when the part is ``causal_safe``, on the decoder side. A new part is enrolled by registering it.

    shapes/finite   output [b, i, dim], finite values and gradients, padded query rows exactly 0
    plans           every fast plan the parts allow (sdpa, banded, flex) == dense, values and gradients
    cached          step-by-step decoding with the cache == one causal forward over the prefix
    cached cross    decoder queries step by step over a cached encoder memory == all queries at once
    no leak         under a causal mask, changing a later token leaves earlier outputs unchanged
    padding         padding the batch (or the encoder memory) to a longer length leaves the real positions unchanged
    causal_safe     building a part with causal_safe=False for the decoder raises a clear error
"""

import pytest
import torch

from sanlab.attention import Attention, Positions, banded, flex
from sanlab.attention.build import build_attention
from sanlab.attention.config import AttentionConfig
from sanlab.attention.registry import PARTS
from sanlab.registry import BuildContext
from decoder_forms import CROSS_CAPABLE, DECODER_UNSAFE
from attention_cases import (CASES, DIM, HEADS, LENGTHS, MAX_LEN, SIDES, assert_plans_agree as _assert_plans_agree,
                             inputs as _inputs, positions as _positions)
from tests_helpers import fast_plans, perturb, spy_plans

EXTRA = 4                  # padding appended by the padding contract (MAX_LEN covers 9 + EXTRA)
CHUNKS = (3, 1, 2, 1, 1, 1)  # decoding steps of the cached contract (sum = 9): a prompt, then steps


def _context(cfg, side: str) -> BuildContext:
    layer = cfg.layers[0] if cfg.layers else 0  # a layer the part is configured for
    return BuildContext(dim=DIM, heads=HEADS, layer_index=layer, num_layers=layer + 2, side=side, max_len=MAX_LEN)




def _attention(cfg, side: str, plan: str = "dense", perturbed: bool = True) -> Attention:
    torch.manual_seed(0)
    part = PARTS.build(cfg, _context(cfg, side))
    attn = Attention(dim=DIM, heads=HEADS, parts=[part], plan=plan).double().eval()
    return perturb(attn) if perturbed else attn


def _decoder_or_skip(cfg, side: str) -> Attention:
    """The attention of ``side``; a part without a decoder form is checked by the causal_safe contract."""
    if side == "decoder" and cfg.type in DECODER_UNSAFE:
        pytest.skip("part has no decoder form (checked by the causal_safe contract)")
    return _attention(cfg, side)


CASE_ID = {id(case.values[0]): case.id for case in CASES}
# The fast plans each case must have, pinned here: the contract below derives them from the parts
# (``plans.runnable``, through ``tests_helpers.fast_plans``), so a regression there would otherwise skip the
# comparison silently.
EXPECTED_FAST_PLANS = {
    "bi_direct-0": {"encoder": ["sdpa"]}, "bi_direct-1": {"encoder": ["sdpa"]},
    "capsule-2": {"decoder": ["sdpa"]},  # vertical routing only, which the decoder form drops
    **{f"csan2d-{n}": {"encoder": ["banded"], "decoder": ["banded"]} for n in range(3)},
    "temperature-0": {"encoder": ["sdpa"], "decoder": ["sdpa"]},
    **{f"window-{n}": {"encoder": ["sdpa", "banded"], "decoder": ["sdpa", "banded"]} for n in range(2)},
}
if flex.AVAILABLE:  # the masks and score biases that parts offer FlexAttention as mods
    for case in ("bi_direct-0", "bi_direct-1", "window-0", "window-1"):
        EXPECTED_FAST_PLANS[case] = {side: [*plans_, "flex"] for side, plans_ in EXPECTED_FAST_PLANS[case].items()}
    for case in ("neighbor-0", "neighbor-1", "local_hard-0", "local_hard-2", "local_soft-0", "local_soft-1",
                 "local_soft-2"):
        EXPECTED_FAST_PLANS[case] = {"encoder": ["flex"], "decoder": ["flex"]}


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("cfg", CASES)
@pytest.mark.parametrize("perturbed", [False, True], ids=["initial", "perturbed"])
def test_shapes_finite_and_padded_rows_zero(cfg, side, perturbed):
    attn = _decoder_or_skip(cfg, side)
    if not perturbed:
        attn = _attention(cfg, side, perturbed=False)
    x, valid = _inputs()
    x.requires_grad_(True)
    out = attn(x, positions=_positions(valid, side)).output
    assert out.shape == (len(LENGTHS), max(LENGTHS), DIM)
    assert torch.isfinite(out).all()
    assert torch.all(out[~valid] == attn.out_proj(torch.zeros(DIM, dtype=out.dtype)))  # zeroed before W_O
    out.pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("cfg", CASES)
def test_fast_plans_equal_dense_values_and_gradients(cfg, side, monkeypatch):
    dense = _decoder_or_skip(cfg, side)
    fast = fast_plans(dense)
    assert fast == EXPECTED_FAST_PLANS.get(CASE_ID[id(cfg)], {}).get(side, [])
    if not fast:
        pytest.skip("no fast plan for this part: dense is its only plan")
    monkeypatch.setattr(banded, "BLOCK", 4)  # several query blocks, the last one partial
    x, valid = _inputs()
    probe = torch.randn(len(LENGTHS), max(LENGTHS), DIM, dtype=torch.float64)
    results = []
    with spy_plans() as ran:
        for plan in ["dense", *fast]:
            attn = _attention(cfg, side, plan)
            attn.load_state_dict(dense.state_dict())
            xi = x.clone().requires_grad_(True)
            out = attn(xi, positions=_positions(valid, side)).output
            (out * probe).sum().backward()
            results.append((plan, out, xi.grad, [p.grad for p in attn.parameters()]))
    assert ran == ["dense", *fast]  # each plan compared ran: none fell back to dense
    _assert_plans_agree(results, side)


@torch.no_grad()  # as decoding runs (tasks/translation.py)
def _decode(attn: Attention, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    cache, outs, start = None, [], 0
    for size in CHUNKS:
        end = start + size
        pos = Positions.self_attention(valid[:, :end], length=size, offset=start, causal=True)
        result = attn(x[:, start:end], positions=pos, cache=cache, use_cache=True)
        cache, start = result.cache, end
        outs.append(result.output)
    return torch.cat(outs, dim=1)  # [b, i, dim]


def _decoding_plans(attn: Attention, plan: str) -> list[str]:
    """The plan each of ``_decode``'s chunks runs: ``plan``, but a single query never runs flex (plans.choose):
    what auto runs there, at these lengths sdpa (masks) or dense (score parts)."""
    one_query = plan if plan != "flex" else "sdpa" if "sdpa" in attn.runnable_plans else "dense"
    return [plan if size > 1 else one_query for size in CHUNKS]


@pytest.mark.parametrize("padded", [False, True], ids=["full-rows", "padded-rows"])
@pytest.mark.parametrize("cfg", CASES)
def test_cached_decoding_equals_full_causal_forward(cfg, padded, monkeypatch):
    dense = _decoder_or_skip(cfg, "decoder")
    monkeypatch.setattr(banded, "BLOCK", 2)
    x, valid = _inputs()
    valid = valid if padded else torch.ones_like(valid)
    assert sum(CHUNKS) == x.shape[1]
    full = dense(x, positions=_positions(valid, "decoder")).output
    for plan in ["dense", *fast_plans(dense)]:
        attn = _attention(cfg, "decoder", plan)
        attn.load_state_dict(dense.state_dict())
        with spy_plans() as ran:
            decoded = _decode(attn, x, valid)
        assert ran == _decoding_plans(attn, plan), f"plan {plan} decoding ran {ran}"
        torch.testing.assert_close(decoded, full, msg=lambda m: f"plan {plan}: {m}")


@pytest.mark.parametrize("cfg", CASES)
def test_later_tokens_do_not_change_earlier_outputs(cfg):
    attn = _decoder_or_skip(cfg, "decoder")
    x, _ = _inputs()
    pos = _positions(torch.ones(x.shape[:2], dtype=torch.bool), "decoder")
    out = attn(x, positions=pos).output
    for t in (1, 4, x.shape[1] - 1):
        changed = x.clone()
        changed[:, t:] = torch.randn_like(changed[:, t:]) * 3.0
        torch.testing.assert_close(attn(changed, positions=pos).output[:, :t], out[:, :t],
                                   msg=lambda m: f"tokens >= {t} leaked into earlier outputs: {m}")


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("cfg", CASES)
def test_extra_padding_leaves_real_positions_unchanged(cfg, side):
    attn = _decoder_or_skip(cfg, side)
    x, valid = _inputs()
    out = attn(x, positions=_positions(valid, side)).output
    longer_valid = torch.cat([valid, torch.zeros(x.shape[0], EXTRA, dtype=torch.bool)], dim=1)  # [b, i + EXTRA]
    longer = torch.cat([x, torch.zeros(x.shape[0], EXTRA, DIM, dtype=x.dtype)], dim=1)  # [b, i + EXTRA, dim]
    longer[~longer_valid] = torch.randn(int((~longer_valid).sum()), DIM, dtype=x.dtype) * 5.0  # new padding values
    out_long = attn(longer, positions=_positions(longer_valid, side)).output
    torch.testing.assert_close(out_long[:, :x.shape[1]][valid], out[valid])


@pytest.mark.parametrize("cfg", CASES)
def test_causal_unsafe_parts_fail_on_the_decoder_side(cfg):
    """On the decoder side a builder may refuse (clear error), build a causal-safe form (a part may
    drop what would leak, e.g. capsule vertical routing), or build a causal_safe=False part, which
    ``build_attention`` must then refuse."""
    config, ctx = AttentionConfig(heads=HEADS, parts=[cfg]), _context(cfg, "decoder")
    part = PARTS.build(cfg, ctx)  # no builder refuses the decoder side; unsafe parts are refused below
    if cfg.type in DECODER_UNSAFE:
        assert not part.causal_safe
        with pytest.raises(ValueError, match="decoder"):
            build_attention(config, ctx)
    else:
        assert part.causal_safe
        assert len(build_attention(config, ctx).parts) == 1


def test_side_sets_name_registered_parts():
    assert DECODER_UNSAFE <= set(PARTS.names()) and CROSS_CAPABLE <= set(PARTS.names())


MEMORY = 7  # encoder memory length of the cross-attention contract (rows of the batch: 7, 6 and 3 valid)


@pytest.mark.parametrize("cfg", CASES)
def test_cached_cross_attention_equals_one_pass(cfg):
    """Decoder queries arriving step by step over a fixed, padded encoder memory (keys and values cached
    once) give what all queries at once give: for parts with a cross-attention form (Shaw's cross
    relative positions, temperatures, Gaussian localness, position interactions, ...)."""
    if cfg.type not in CROSS_CAPABLE and not getattr(cfg, "cross", False):  # rel_pos: only with cross: true
        with pytest.raises(ValueError, match="cross-attention|encoder-decoder|same sequence"):
            PARTS.build(cfg, _context(cfg, "cross"))
        return
    attn = _attention(cfg, "cross")
    x, valid = _inputs()
    memory, _ = _inputs(length=MEMORY, seed=2)
    memory_valid = torch.arange(MEMORY)[None, :] < torch.tensor([7, 6, 3])[:, None]

    def cross(query: Positions) -> Positions:
        return Positions.cross_attention(query, memory_valid, memory_length=MEMORY)

    full = attn(x, positions=cross(_positions(valid, "decoder")), memory=memory).output
    cache, outs, start = None, [], 0
    for size in CHUNKS:
        end = start + size
        query = Positions.self_attention(valid[:, :end], length=size, offset=start, causal=True)
        result = attn(x[:, start:end], positions=cross(query), memory=memory, cache=cache, use_cache=True)
        cache, start = result.cache, end
        outs.append(result.output)
    torch.testing.assert_close(torch.cat(outs, dim=1), full)


# parts whose cross-attention runs the fused SDPA plan (the others' biases need the dense one): pinned, so that a
# part falling back to dense fails instead of skipping
CROSS_FUSED = {"temperature"}
CROSS_CASES = [pytest.param(None, id="no-parts")] + [c for c in CASES if c.values[0].type in CROSS_CAPABLE
                                                     or getattr(c.values[0], "cross", False)]


@pytest.mark.parametrize("cfg", CROSS_CASES)
def test_cross_attention_fast_plan_equals_dense_values_and_gradients(cfg):
    """Every translation model's cross-attention runs the fused SDPA plan (non-square, padded memory)."""
    def build(plan: str) -> Attention:
        torch.manual_seed(0)
        parts = [] if cfg is None else [PARTS.build(cfg, _context(cfg, "cross"))]
        attn = Attention(dim=DIM, heads=HEADS, parts=parts, plan=plan).double().eval()
        perturb(attn)
        return attn

    dense = build("dense")
    fused = cfg is None or cfg.type in CROSS_FUSED
    assert dense.stage_parts.needs_dense() != fused, "a part's cross-attention plan changed: update CROSS_FUSED"
    if not fused:
        pytest.skip("no fast plan for this part in cross-attention: dense is its only plan")
    x, valid = _inputs()
    memory, _ = _inputs(length=MEMORY, seed=2)
    memory_valid = torch.arange(MEMORY)[None, :] < torch.tensor([7, 6, 3])[:, None]
    positions = Positions.cross_attention(_positions(valid, "decoder"), memory_valid, memory_length=MEMORY)
    probe = torch.randn(len(LENGTHS), max(LENGTHS), DIM, dtype=torch.float64)
    results = []
    with spy_plans() as ran:
        for plan in ("dense", "sdpa"):
            attn = build(plan)
            attn.load_state_dict(dense.state_dict())
            xi, mi = x.clone().requires_grad_(True), memory.clone().requires_grad_(True)
            out = attn(xi, positions=positions, memory=mi).output
            (out * probe).sum().backward()
            results.append((out, xi.grad, mi.grad, [p.grad for p in attn.parameters()]))
    assert ran == ["dense", "sdpa"]  # the sdpa plan ran the fused kernel, so dense is not compared with itself
    (ref, ref_dx, ref_dm, ref_dp), (out, dx, dm, dp) = results
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(dx, ref_dx)
    torch.testing.assert_close(dm, ref_dm)
    for g, r in zip(dp, ref_dp):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("cfg", CROSS_CASES)
def test_extra_memory_padding_leaves_cross_attention_unchanged(cfg):
    """Padding the encoder memory further (with garbage) changes no real query row: parts that read the
    memory length (Gaussian centres predicted in [0, L)) must take L from the valid keys, not the tensor."""
    if cfg is None:
        attn = Attention(dim=DIM, heads=HEADS).double().eval()
        perturb(attn)
    else:
        attn = _attention(cfg, "cross")
    x, valid = _inputs()
    query = _positions(valid, "decoder")
    memory, _ = _inputs(length=MEMORY, seed=2)
    memory_valid = torch.arange(MEMORY)[None, :] < torch.tensor([7, 6, 3])[:, None]
    out = attn(x, positions=Positions.cross_attention(query, memory_valid, memory_length=MEMORY),
               memory=memory).output
    longer_valid = torch.cat([memory_valid, torch.zeros(len(LENGTHS), EXTRA, dtype=torch.bool)], dim=1)
    longer = torch.cat([memory, torch.zeros(len(LENGTHS), EXTRA, DIM, dtype=memory.dtype)], dim=1)
    longer[~longer_valid] = torch.randn(int((~longer_valid).sum()), DIM, dtype=memory.dtype) * 5.0
    out_long = attn(x, positions=Positions.cross_attention(query, longer_valid, memory_length=MEMORY + EXTRA),
                    memory=longer).output
    torch.testing.assert_close(out_long[valid], out[valid])


# ----------------------------------------------------------------------------- two parts in one layer
FIRST_EXAMPLES = {name: PARTS.entry(name).config.examples()[0] for name in PARTS.names()}
PAIRS = [pytest.param(FIRST_EXAMPLES[a], FIRST_EXAMPLES[b], id=f"{a}+{b}")
         for n, a in enumerate(PARTS.names()) for b in PARTS.names()[n + 1:]]


# Pairs refused in one layer on purpose: 2D-CSAN repeats keys per head block, which parts that measure
# the sentence from the keys (Gaussian localness) or need one key column per position cannot take.
REFUSED_PAIRS = {("capsule", "csan2d"), ("conv_attention", "csan2d"), ("csan2d", "local_hard"),
                 ("csan2d", "local_soft"), ("csan2d", "neighbor")}


def _pair(cfg_a, cfg_b, side: str, plan: str = "dense") -> Attention:
    """Two parts in one attention (on the layer both are configured for), parameters perturbed."""
    layer = next(i for i in range(MAX_LEN) if cfg_a.applies_to(i) and cfg_b.applies_to(i))
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=layer, num_layers=layer + 2, side=side, max_len=MAX_LEN)
    torch.manual_seed(0)
    attn = Attention(dim=DIM, heads=HEADS, parts=[PARTS.build(cfg_a, ctx), PARTS.build(cfg_b, ctx)],
                     plan=plan).double().eval()
    perturb(attn)
    return attn


@pytest.mark.slow  # 85 pairs, about a quarter of the fast suite's time: make test runs them
@pytest.mark.parametrize("cfg_a, cfg_b", PAIRS)
def test_two_parts_in_one_layer_keep_the_plan_and_cache_contracts(cfg_a, cfg_b, monkeypatch):
    """Parts compose (csan2d + rel_pos: extend, then score the extended keys; window + temperature under
    the banded plan): every plan gives the dense values and gradients, and, on the decoder side, cached
    step-by-step decoding under every plan gives the full causal forward. The refused pairs say so."""
    if (cfg_a.type, cfg_b.type) in REFUSED_PAIRS:
        with pytest.raises(ValueError, match="put them in different layers"):
            _pair(cfg_a, cfg_b, "encoder")
        return
    monkeypatch.setattr(banded, "BLOCK", 2)
    x, valid = _inputs()
    probe = torch.randn(len(LENGTHS), max(LENGTHS), DIM, dtype=torch.float64)
    sides = ["encoder"] + ([] if DECODER_UNSAFE & {cfg_a.type, cfg_b.type} else ["decoder"])
    for side in sides:
        dense = _pair(cfg_a, cfg_b, side)
        results = []
        for plan in ["dense", *fast_plans(dense)]:
            attn = _pair(cfg_a, cfg_b, side, plan)
            attn.load_state_dict(dense.state_dict())
            xi = x.clone().requires_grad_(True)
            with spy_plans() as ran:
                out = attn(xi, positions=_positions(valid, side)).output
            assert ran == [plan], f"{side}, plan {plan} ran {ran}"
            (out * probe).sum().backward()
            results.append((plan, out.detach(), xi.grad, [p.grad for p in attn.parameters()]))
            if side == "decoder":
                with torch.no_grad(), spy_plans() as ran:
                    decoded = _decode(attn, x, valid)
                assert ran == _decoding_plans(attn, plan), f"cached decoding, plan {plan} ran {ran}"
                torch.testing.assert_close(decoded, out.detach(), msg=lambda m: f"cached decoding, plan {plan}: {m}")
        _assert_plans_agree(results, side)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("cfg", CASES)
def test_a_row_of_padding_only_leaves_every_gradient_finite(cfg, side):
    """A sentence of no token beside a real one (Attention used as a library may get one): its output is
    masked, and its backward must not put NaN into the weights every sentence shares (Local_Soft's mean key
    divided 0 by 0 there)."""
    attn = _decoder_or_skip(cfg, side)
    x, _ = _inputs()
    valid = torch.zeros_like(_inputs()[1])
    valid[0, :3] = True   # one short sentence; every other row is padding only
    x.requires_grad_(True)
    out = attn(x, positions=_positions(valid, side)).output
    assert torch.isfinite(out).all()
    out.pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    assert [n for n, p in attn.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()] == []
