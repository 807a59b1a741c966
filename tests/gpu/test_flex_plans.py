"""CUDA kernels of the plan choice against the dense plan: FlexAttention (compiled) and SDPA without
materialised masks, values and gradients, fp32 and bf16. Marked ``gpu``; skipped where torch sees no CUDA
device. The CPU suite checks the same mods through torch's reference operator (tests/attention/test_flex.py)
and the mask forms of the sdpa plan (tests/attention/test_sdpa.py); this file checks the kernels themselves,
at lengths that cross FlexAttention's 128-position blocks.
"""

import pytest
import torch

from sanlab.attention import Attention, Positions, flex, plans
from sanlab.attention.plans import StageParts
from sanlab.attention.registry import PARTS
from sanlab.errors import ConfigError
from sanlab.registry import BuildContext
from tests_helpers import assert_close_in_norm, spy_plans, weight_grads

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)"),
              pytest.mark.skipif(not flex.AVAILABLE, reason="this torch has no FlexAttention (torch < 2.5)")]

DIM, HEADS, LENGTHS = 64, 4, (300, 131, 7)  # not a multiple of the 128-position blocks, with padding
CUDA = torch.device("cuda")
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
TOLERANCE = {torch.float32: dict(atol=2e-4, rtol=2e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}
EXAMPLES = [(name, n, cfg) for name in PARTS.names() for n, cfg in enumerate(PARTS.entry(name).config.examples())]


def _parts(cfg, side: str) -> list:
    if cfg is None:
        return []
    layer = cfg.layers[0] if cfg.layers else 0
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=layer, num_layers=layer + 2, side=side, max_len=512)
    return [PARTS.build(cfg, ctx)]


def _build(cfg, side: str, plan: str) -> Attention:
    torch.manual_seed(0)
    attn = Attention(dim=DIM, heads=HEADS, parts=_parts(cfg, side), plan=plan).to(CUDA)
    if side == "decoder":
        attn.check_causal()
    return attn


FLEX_CASES = [pytest.param(cfg, id=f"{name}-{n}") for name, n, cfg in EXAMPLES
              if "flex" in plans.runnable(StageParts.sort(_parts(cfg, "encoder")))]


def _inputs(side: str, *, lengths=LENGTHS):
    g = torch.Generator(device=CUDA).manual_seed(1)
    x = torch.randn(len(lengths), max(lengths), DIM, generator=g, device=CUDA)
    valid = torch.arange(max(lengths), device=CUDA)[None] < torch.tensor(lengths, device=CUDA)[:, None]
    positions = Positions.self_attention(valid, length=valid.shape[1], causal=side == "decoder", device=CUDA)
    kw = dict(positions=positions)
    if side == "cross":
        memory = torch.randn(len(lengths), 200, DIM, generator=g, device=CUDA)
        memory_valid = torch.arange(200, device=CUDA)[None] < torch.tensor([200, 90, 3], device=CUDA)[:, None]
        kw = dict(positions=Positions.cross_attention(positions, memory_valid, memory_length=200), memory=memory)
    return x, torch.randn(x.shape, generator=g, device=CUDA), kw


def _compare(cfg, side: str, plan: str, dtype, *, lengths=LENGTHS, no_padding=False):
    try:
        dense = _build(cfg, side, "dense")
    except (ValueError, ConfigError) as err:  # no decoder or cross form (the CPU contract tests check it)
        pytest.skip(str(err))
    fast = _build(cfg, side, plan)
    fast.load_state_dict(dense.state_dict())
    x, probe, kw = _inputs(side, lengths=lengths)
    if no_padding:
        pos = kw["positions"]
        kw["positions"] = Positions.self_attention(None, length=x.shape[1], causal=pos.causal, device=CUDA)
    results = []
    with spy_plans() as ran:
        for attn in (dense, fast):
            xi = x.clone().requires_grad_(True)
            with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
                out = attn(xi, **kw).output
            (out.float() * probe).sum().backward()
            results.append((out.float(), xi.grad, weight_grads(attn)))
    assert ran == ["dense", plan]  # the plan compared ran: a fallback to dense would compare dense with itself
    (out_d, grad_d, params_d), (out_f, grad_f, params_f) = results
    torch.testing.assert_close(out_f, out_d, **TOLERANCE[dtype], msg=lambda m: f"{plan} values: {m}")
    torch.testing.assert_close(grad_f, grad_d, **TOLERANCE[dtype], msg=lambda m: f"{plan} gradients: {m}")
    # the weights' gradients too (the Gaussian parts' predictors get theirs through the score_mod's captures), in
    # norm: tests_helpers.assert_close_in_norm
    assert_close_in_norm(params_f, params_d, rtol=TOLERANCE[dtype]["rtol"], what=f"{plan} weight gradients")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("side", ["encoder", "decoder", "cross"])
@pytest.mark.parametrize("cfg", FLEX_CASES)
def test_flex_equals_dense_on_cuda(cfg, side, dtype):
    _compare(cfg, side, "flex", dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("side, no_padding", [("encoder", True), ("encoder", False), ("decoder", True),
                                              ("decoder", False), ("cross", False)])
def test_sdpa_without_materialised_masks_equals_dense_on_cuda(side, no_padding, dtype):
    _compare(None, side, "sdpa", dtype, no_padding=no_padding)


def test_auto_takes_flex_on_cuda_from_its_threshold_on():
    cfg = PARTS.entry("bi_direct").config.examples()[0]  # a mask the banded plan cannot run
    attn = _build(cfg, "encoder", "auto").eval()
    with spy_plans() as ran, torch.no_grad():
        for length in (flex.MIN_KEYS - 1, flex.MIN_KEYS):
            attn(torch.randn(2, length, DIM, device=CUDA), positions=Positions.self_attention(None, length=length,
                                                                                              device=CUDA))
    assert ran == ["sdpa", "flex"]  # below the threshold the fused kernel takes the mask


@pytest.mark.parametrize("plan", ["flex", "sdpa"])
@pytest.mark.parametrize("name, n", [("window", 1), ("local_soft", 0), ("local_hard", 2), (None, 0)])
def test_cached_decoding_equals_the_full_dense_forward_on_cuda(name, n, plan):
    cfg = None if name is None else PARTS.entry(name).config.examples()[n]
    if cfg is None and plan == "flex":
        pytest.skip("nothing for FlexAttention to mask without parts")
    try:
        dense, fast = _build(cfg, "decoder", "dense").eval(), _build(cfg, "decoder", plan).eval()
    except ValueError as err:  # a part whose masks sdpa cannot take (score parts)
        pytest.skip(str(err))
    fast.load_state_dict(dense.state_dict())
    x = torch.randn(2, 140, DIM, device=CUDA)
    valid = torch.ones(2, 140, dtype=torch.bool, device=CUDA)
    valid[1, 120:] = False
    with torch.no_grad():
        full = dense(x, positions=Positions.self_attention(valid, length=140, causal=True, device=CUDA)).output
        cache, steps, start = None, [], 0
        with spy_plans() as ran:
            for size in (130, 1, 1, 8):  # a prompt across a block boundary, then steps after the cache
                pos = Positions.self_attention(valid[:, :start + size], length=size, offset=start, causal=True,
                                               device=CUDA)
                result = fast(x[:, start:start + size], positions=pos, cache=cache, use_cache=True)
                cache, start = result.cache, start + size
                steps.append(result.output)
    # a single query never runs flex (plans.choose): what auto runs there, at 131-132 keys sdpa (masks) or dense
    one_query = plan if plan != "flex" else "sdpa" if "sdpa" in fast.runnable_plans else "dense"
    assert ran == [plan, one_query, one_query, plan]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=2e-4, rtol=2e-4)
