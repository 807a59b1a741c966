"""The flex plan: the masks and score biases that parts offer as FlexAttention mods equal the dense plan.

On the CPU the plan runs torch's unfused reference of ``flex_attention`` (``flex._reference``), so these tests
check the mods and their composition (padding, causality, per-head and data-dependent windows, Gaussian
biases with gradients into their centres and widths), not the speed or the CUDA kernel (tests/gpu/).
"""

import pytest
import torch

from sanlab.attention import Attention, AttentionContext, Positions, flex, plans
from sanlab.attention.plans import StageParts
from sanlab.attention.registry import PARTS
from sanlab.errors import ConfigError
from sanlab.registry import BuildContext
from tests_helpers import spy_plans

pytestmark = pytest.mark.skipif(not flex.AVAILABLE, reason="this torch has no usable FlexAttention (torch < 2.6)")

DIM, HEADS, LENGTHS = 16, 4, (9, 6, 1)
EXAMPLES = [(name, n, cfg) for name in PARTS.names() for n, cfg in enumerate(PARTS.entry(name).config.examples())]


def _build(cfg, side: str, plan: str) -> Attention:
    torch.manual_seed(0)
    layer = cfg.layers[0] if cfg.layers else 0
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=layer, num_layers=layer + 2, side=side, max_len=64)
    return Attention(dim=DIM, heads=HEADS, parts=[PARTS.build(cfg, ctx)], plan=plan).double()


def _offers_flex(cfg) -> bool:
    return "flex" in plans.runnable(_build(cfg, "encoder", "dense").stage_parts)


FLEX_CASES = [pytest.param(cfg, id=f"{name}-{n}") for name, n, cfg in EXAMPLES if _offers_flex(cfg)]


def test_the_parts_that_offer_flexattention():
    offered = {(name, n) for name, n, cfg in EXAMPLES if _offers_flex(cfg)}
    assert offered == {("window", 0), ("window", 1), ("bi_direct", 0), ("bi_direct", 1), ("neighbor", 0),
                       ("neighbor", 1), ("local_hard", 0), ("local_hard", 2), ("local_soft", 0), ("local_soft", 1),
                       ("local_soft", 2)}  # not: 2D-CSAN (extends keys), luong_exact, Rel_Pos, capsule, Dufter's


def _valid(lengths=LENGTHS) -> torch.Tensor:
    return torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]  # [b, j]


def _run(attn: Attention, x: torch.Tensor, probe: torch.Tensor, **kw):
    attn.zero_grad()
    xi = x.clone().requires_grad_(True)
    out = attn(xi, **kw).output
    (out * probe).sum().backward()
    return out, xi.grad, [p.grad.clone() for p in attn.parameters() if p.grad is not None]


# the encoder and decoder sides are compared by the contracts (tests/attention/test_contracts.py, plan 'flex');
# here: a batch with a one-token sentence, and cross-attention over a differently padded memory
@pytest.mark.parametrize("side", ["encoder", "cross"])
@pytest.mark.parametrize("cfg", FLEX_CASES)
def test_flex_equals_dense_in_values_and_gradients(cfg, side):
    try:
        dense = _build(cfg, side, "dense")
    except (ValueError, ConfigError) as err:  # no cross form (the contract tests check the refusal)
        pytest.skip(str(err))
    fast = _build(cfg, side, "flex")
    fast.load_state_dict(dense.state_dict())
    g = torch.Generator().manual_seed(3)
    x = torch.randn(len(LENGTHS), max(LENGTHS), DIM, generator=g, dtype=torch.float64)
    probe = torch.randn(x.shape, generator=g, dtype=torch.float64)
    valid = _valid()
    positions = Positions.self_attention(valid, length=valid.shape[1])
    kw = dict(positions=positions)
    if side == "cross":  # a shorter, differently padded memory
        memory = torch.randn(len(LENGTHS), 5, DIM, generator=g, dtype=torch.float64)
        memory_valid = _valid((5, 2, 3))
        kw = dict(positions=Positions.cross_attention(positions, memory_valid, memory_length=5), memory=memory)
    with spy_plans() as ran:
        out_d, dx_d, dp_d = _run(dense, x, probe, **kw)
        out_f, dx_f, dp_f = _run(fast, x, probe, **kw)
    assert ran == ["dense", "flex"]  # a part whose cross form had nothing for flex would run what auto runs
    torch.testing.assert_close(out_f, out_d)
    torch.testing.assert_close(dx_f, dx_d)
    assert len(dp_f) == len(dp_d)
    for a, b in zip(dp_f, dp_d):
        torch.testing.assert_close(a, b)


@pytest.mark.slow  # the flex plan's cached steps; the contract tests check cached == full for every part fast
@pytest.mark.parametrize("name, n", [("window", 1), ("local_soft", 0), ("local_hard", 2)])
def test_cached_decoding_with_flex_equals_the_full_dense_forward(name, n):
    cfg = PARTS.entry(name).config.examples()[n]
    dense, fast = _build(cfg, "decoder", "dense").eval(), _build(cfg, "decoder", "flex").eval()
    fast.load_state_dict(dense.state_dict())
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    valid = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    with torch.no_grad():
        full = dense(x, positions=Positions.self_attention(valid, length=7, causal=True)).output
        cache, steps, start = None, [], 0
        with spy_plans() as ran:
            for size in (3, 1, 2, 1):  # a prompt at positions 0..2, then steps whose queries sit after the cache
                pos = Positions.self_attention(valid[:, :start + size], length=size, offset=start, causal=True)
                result = fast(x[:, start:start + size], positions=pos, cache=cache, use_cache=True)
                cache, start = result.cache, start + size
                steps.append(result.output)
    one_query = "sdpa" if name == "window" else "dense"  # what auto runs for a single query (plans.choose)
    assert ran == ["flex", one_query, "flex", one_query]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


@pytest.mark.slow  # dynamo traces of flex_attention (about 2 s on this CPU; 5 s before, a graph per step)
@pytest.mark.parametrize("name, n", [("window", 1), ("local_soft", 0)])
def test_a_cached_decode_compiles_the_kernel_for_its_prompt_not_at_every_step(monkeypatch, name, n):
    """CUDA's kernel (``flex._compiled``, integers specialised) compiles once per (query length, key length): a
    decoder's steps, one query and one key more each, compiled a graph per step (10 for a prompt and 9 steps here,
    torch 2.13) up to the recompile limit, seconds each on a GPU. A one-query step now runs what ``auto`` runs
    (``plans.choose``): only the prompt compiles. Here the CPU's branch runs that compiled kernel, with dynamo's
    eager backend (fast; the CPU's inductor cannot build the kernel with a symbolic key length: docs/performance.md)."""
    import functools

    import torch._dynamo
    from torch._dynamo.utils import counters

    graphs = []

    def compiled_kernel(q, k, v, score_mod, block_mask, scale):  # what flex.attend runs on CUDA
        before = counters["stats"]["unique_graphs"]
        out = flex._compiled()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
        graphs.append(counters["stats"]["unique_graphs"] - before)
        return out

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    monkeypatch.setattr(flex, "_reference", compiled_kernel)
    cfg = PARTS.entry(name).config.examples()[n]
    dense, fast = _build(cfg, "decoder", "dense").eval(), _build(cfg, "decoder", "flex").eval()
    fast.load_state_dict(dense.state_dict())
    x = torch.randn(2, 12, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    valid = torch.tensor([[True] * 12, [True] * 9 + [False] * 3])
    torch._dynamo.reset()
    flex._compiled.cache_clear()  # (compiled anew: with the backend this test asks for)
    try:
        with torch.no_grad():
            full = dense(x, positions=Positions.self_attention(valid, length=12, causal=True)).output
            cache, steps, start = None, [], 0
            with spy_plans() as ran:
                for size in (3, *[1] * 9):  # a prompt, then one query a step
                    pos = Positions.self_attention(valid[:, :start + size], length=size, offset=start, causal=True)
                    result = fast(x[:, start:start + size], positions=pos, cache=cache, use_cache=True)
                    cache, start = result.cache, start + size
                    steps.append(result.output)
    finally:
        flex._compiled.cache_clear()
        torch._dynamo.reset()
    assert graphs == [1]  # the prompt's kernel; before: [1] * 10, one graph per step
    assert ran[0] == "flex" and "flex" not in ran[1:]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_one_process_runs_local_hard_windows_of_different_widths():
    """The compiled kernel is called with a mask closure over Local_Hard's width D; a Python float there turned
    symbolic when the width changed between calls, and torch 2.15's flex_attention refused it (the contract tests
    failed in the order they happened to run; here the order is fixed). D is now captured as a tensor."""
    x = torch.randn(len(LENGTHS), max(LENGTHS), DIM, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    positions = Positions.self_attention(_valid(), length=max(LENGTHS))
    for window in (10.0, 2.0):
        cfg = PARTS.entry("local_hard").config(layers=None, window=window, truncate=True)
        dense = _build(cfg, "encoder", "dense")
        fast = _build(cfg, "encoder", "flex")
        fast.load_state_dict(dense.state_dict())
        with spy_plans() as ran:
            torch.testing.assert_close(fast(x, positions=positions).output, dense(x, positions=positions).output)
        assert ran == ["flex", "dense"]


def test_rows_without_visible_keys_are_zero_with_finite_gradients():
    part = PARTS.build(PARTS.entry("window").config.examples()[0],
                       BuildContext(dim=DIM, heads=HEADS, layer_index=0, num_layers=1, side="encoder", max_len=64))
    key_valid = torch.tensor([[True, True, False, False, False, False], [False] * 6])
    q, k, v = (torch.randn(2, 2, 6, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ctx = AttentionContext(positions=Positions.self_attention(key_valid, length=6), heads=2, head_dim=3, q=q, k=k)
    out = flex.attend(q, k, v, ctx, parts=StageParts.sort([part]), scale=1.0, dropout=0.0, training=False)
    assert torch.all(out[0, :, 3:] == 0) and torch.all(out[1] == 0)  # query 3 sees keys 2..4: padding only
    assert torch.all(out[0, :, :3].abs().sum(-1) > 0)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_plan_flex_refuses_what_it_cannot_run():
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=0, num_layers=1, side="encoder", max_len=64)
    csan2d = PARTS.build(PARTS.entry("csan2d").config.examples()[0], ctx)
    with pytest.raises(ValueError, match="plan 'flex' needs parts that offer FlexAttention.*got parts: HeadArea"):
        Attention(dim=DIM, heads=HEADS, parts=[csan2d], plan="flex")
    window = PARTS.build(PARTS.entry("window").config.examples()[0], ctx)
    with pytest.raises(ValueError, match="plan 'flex' has no attention dropout"):
        Attention(dim=DIM, heads=HEADS, parts=[window], plan="flex", dropout=0.1)
    plain = Attention(dim=DIM, heads=HEADS, plan="flex")  # nothing to mask: such layers run what 'auto' runs
    with spy_plans() as ran:
        plain(torch.randn(1, 3, DIM), positions=Positions.self_attention(None, length=3))
    assert ran == ["sdpa"]


def test_without_flexattention_the_plan_is_not_offered(monkeypatch):
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=0, num_layers=1, side="encoder", max_len=64)
    window = PARTS.build(PARTS.entry("window").config.examples()[0], ctx)
    monkeypatch.setattr(flex, "AVAILABLE", False)
    assert "flex" not in plans.runnable(StageParts.sort([window]))
    with pytest.raises(ValueError, match="needs torch.nn.attention.flex_attention"):
        Attention(dim=DIM, heads=HEADS, parts=[window], plan="flex")


def test_before_torch_2_7_only_heads_of_a_power_of_two_size_take_the_plan(monkeypatch):
    """torch 2.5-2.6's FlexAttention raises "NYI: non power of 2 embedding dimension" at the first call:
    refused when built (plan: flex), never chosen (auto)."""
    ctx = BuildContext(dim=48, heads=1, layer_index=0, num_layers=1, side="encoder", max_len=64)
    window = PARTS.build(PARTS.entry("window").config.examples()[0], ctx)
    monkeypatch.setattr(flex, "TORCH", (2, 6))
    with pytest.raises(ValueError, match="heads whose size is a power of two.*these heads have 48"):
        Attention(dim=48, heads=1, parts=[window], plan="flex")
    assert "flex" not in Attention(dim=48, heads=1, parts=[window], plan="auto").runnable_plans
    assert "flex" in Attention(dim=48, heads=3, parts=[window], plan="flex").runnable_plans  # 16 a head
    monkeypatch.setattr(flex, "TORCH", (2, 7))
    assert "flex" in Attention(dim=48, heads=1, parts=[window], plan="flex").runnable_plans


@pytest.mark.slow
def test_the_compiled_kernel_takes_windows_of_different_widths_in_one_process():
    """The kernel CUDA runs (``flex._compiled``, inductor), here on the CPU, forward only: windows of three widths
    one after another, as an encoder's and a decoder's windows come in one process. Without the specialised
    integers torch turned the window's offsets symbolic at the second width and inductor's lowering failed (on
    an H200 with torch 2.11, and on the CPU with 2.13)."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import create_block_mask

    from sanlab.attention.parts.window import WindowMask

    torch._dynamo.reset()
    # 64 positions: torch 2.13's CPU kernel (not the CUDA one this guards) gave wrong rows at a length of 40
    valid = torch.arange(64)[None] < torch.tensor([64, 29])[:, None]
    positions = Positions.self_attention(valid, length=64)
    for m in (1, 2, 3):
        q, k, v = (torch.randn(2, 2, 64, 8) for _ in range(3))
        ctx = AttentionContext(positions=positions, heads=2, head_dim=8, q=q, k=k)
        parts = StageParts.sort([WindowMask(half_width=m)])
        block_mask = create_block_mask(flex._mask_mod(ctx, parts), 2, 2, 64, 64, device="cpu")
        with torch.no_grad():
            out = flex._compiled()(q, k, v, block_mask=block_mask, scale=8 ** -0.5)
            ref = plans.dense(q, k, v, ctx, parts=parts, scale=8 ** -0.5, dropout=0.0, training=False, trace=None)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5, msg=lambda msg: f"window m={m}: {msg}")


@pytest.mark.slow
def test_the_compiled_block_mask_builder_equals_the_eager_one(monkeypatch):
    """CUDA builds each call's block mask with ``create_block_mask`` compiled (``flex._compiled_block_mask``, batch
    size and lengths symbolic once they change); here the same compiled builder runs on the CPU beside the eager
    one, for four kinds of mask_mod, with padding and with causality, in one process: the same blocks and the same
    dense mask."""
    import torch._dynamo

    torch._dynamo.reset()
    eager = flex.create_block_mask
    compiled = flex._with_settings(eager, specialize_int=False)  # as _compiled_block_mask
    checked = []

    def both(mask_mod, *args, **kwargs):
        expected, found = eager(mask_mod, *args, **kwargs), compiled(mask_mod, *args, **kwargs)
        assert torch.equal(found.to_dense(), expected.to_dense())
        for a, b in zip(found.as_tuple(), expected.as_tuple()):
            assert a == b if not isinstance(a, torch.Tensor) else torch.equal(a, b)
        checked.append(1)
        return expected

    monkeypatch.setattr(flex, "create_block_mask", both)
    x = torch.randn(2, 40, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    valid = torch.arange(40)[None] < torch.tensor([40, 23])[:, None]
    # a window of two widths (the kernel's regression), per-head directions, and a window per (b, h, i) from the
    # data: each a mask_mod of its own kind; each compile takes a while on this CPU
    for (name, n), side in ((("window", 0), "encoder"), (("window", 1), "decoder"), (("bi_direct", 0), "encoder"),
                            (("local_hard", 0), "decoder")):
        with torch.no_grad():
            _build(PARTS.entry(name).config.examples()[n], side, "flex")(
                x, positions=Positions.self_attention(valid, length=40, causal=side == "decoder"))
    assert len(checked) == 4


def test_past_the_recompile_limit_the_kernel_runs_uncompiled_even_where_training_stops_at_it(monkeypatch):
    """The kernel compiles once per (query length, key length) (integers specialised): batches of new lengths
    each compile one (a decoder's one-query steps, a key more each, no longer run it: ``plans.choose``). Past the
    recompile limit torch runs them uncompiled, as ``_with_settings`` says, also in a process where ``train.compile`` made hitting the limit an error for the
    model (``training.compile.configure_dynamo``): validation's decoding, through the eager model, stopped there
    with dynamo's FailOnRecompileLimitHit. Here with dynamo's eager backend and a limit of 2 (fast)."""
    import functools

    import torch._dynamo

    from sanlab.compile_limits import LIMIT_SETTINGS
    from sanlab.training.compile import FAIL_SETTINGS

    known = torch._dynamo.config.get_config_copy()
    limit, fail = next(n for n in LIMIT_SETTINGS if n in known), next(n for n in FAIL_SETTINGS if n in known)
    monkeypatch.setattr(flex, "raised_limit", lambda: {limit: 2})
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    run = flex._with_settings(lambda x, n: x[:n].sum(), specialize_int=True)  # (a new function: nothing cached by an earlier test)
    x = torch.arange(10.0)
    with torch._dynamo.config.patch({fail: True}):  # as train.compile leaves the process
        assert [float(run(x, n)) for n in range(1, 6)] == [float(x[:n].sum()) for n in range(1, 6)]


def test_a_tensor_a_score_mod_captures_gets_its_gradient_when_q_k_v_need_none():
    """Gaussian parts' score_mod captures their predicted centres and widths: those need a gradient even where
    q, k and v need none (frozen projections). The reference's eager shortcut (no dynamo trace) is for autograd
    off only; taken whenever q, k, v needed no gradient, it lost the captured tensor's (output without grad_fn)."""
    g = torch.Generator().manual_seed(5)
    b, h, i, j, d = 2, 3, 4, 5, 8
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for n in (i, j, j))
    slope = torch.randn(h, generator=g, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(b, h, i, d, generator=g, dtype=torch.float64)

    def score_mod(score, b_, h_, q_idx, kv_idx):
        return score + slope[h_] * (q_idx - kv_idx)

    out = flex._reference(q, k, v, score_mod, None, 0.5)
    assert out.requires_grad
    (found,) = torch.autograd.grad((out * probe).sum(), slope)
    distance = (torch.arange(i)[:, None] - torch.arange(j)[None]).to(torch.float64)  # [i, j]
    scores = q @ k.transpose(-1, -2) * 0.5 + slope[None, :, None, None] * distance
    expected_out = scores.softmax(-1) @ v
    (expected,) = torch.autograd.grad((expected_out * probe).sum(), slope)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(found, expected)
    with torch.no_grad():  # the shortcut's case (decoding): the same values
        torch.testing.assert_close(flex._reference(q, k, v, score_mod, None, 0.5), expected_out.detach())


# batches of Multi30k-like shapes: lengths padded to a multiple of 8, batch sizes varying (each a new (B, L))
VARYING_SHAPES = [(5, 32), (4, 40), (6, 16), (3, 24), (2, 32), (6, 40)]


def _builder_graphs(shapes, *, check=None) -> int:
    """How many graphs ``flex._compiled_block_mask`` compiles for a padded 1D window over batches of ``shapes``;
    ``check(block_mask, ctx, parts, lengths)`` sees each block mask (its own compiles are not counted)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from sanlab.attention.parts.window import WindowMask

    parts = StageParts.sort([WindowMask(half_width=2)])
    torch._dynamo.reset()
    flex._compiled_block_mask.cache_clear()  # (compiled anew: with the backend the test asks for)
    graphs = 0
    try:
        for b, length in shapes:
            lengths = [length - n % 8 for n in range(b)]
            positions = Positions.self_attention(_valid(lengths), length=length)
            q = torch.randn(b, 2, length, 8, dtype=torch.float64)
            ctx = AttentionContext(positions=positions, heads=2, head_dim=8, q=q, k=q)
            before = counters["stats"]["unique_graphs"]
            block_mask = flex._compiled_block_mask()(flex._mask_mod(ctx, parts), b, 2, length, length, device="cpu")
            graphs += counters["stats"]["unique_graphs"] - before
            if check is not None:
                check(block_mask, ctx, parts, lengths)
        return graphs
    finally:
        flex._compiled_block_mask.cache_clear()
        torch._dynamo.reset()


@pytest.mark.slow  # about 5 s: a dynamo trace of create_block_mask per graph
def test_the_block_mask_builder_compiles_a_bounded_number_of_graphs_over_varying_batch_shapes(monkeypatch):
    """The builder's batch size and lengths are plain integers: specialised as the kernel's are, each new
    (batch size, length) compiled a graph of its own (14 graphs for 20 Multi30k-like batches, measured with torch
    2.13), and past the recompile limit the builder ran uncompiled, forming the whole [b, h, i, j] mask. Left to
    torch's automatic dynamic shapes: a static graph, then one symbolic graph. Dynamo's eager backend (fast)."""
    import functools

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    assert _builder_graphs(VARYING_SHAPES) == 2


@pytest.mark.slow  # inductor's builds of the builder (tens of seconds on two cores)
def test_the_compiled_block_mask_over_varying_batch_shapes_gives_the_dense_values_and_gradients():
    """The builder as CUDA runs it (inductor, symbolic batch size and lengths), here on the CPU: each batch's block
    mask, run through the plan's reference kernel, equals the dense plan in values and gradients."""
    def check(block_mask, ctx, parts, lengths):
        g = torch.Generator().manual_seed(len(lengths))
        q, k, v = (torch.randn(ctx.q.shape, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
        probe = torch.randn(ctx.q.shape, generator=g, dtype=torch.float64)
        found = flex._reference(q, k, v, None, block_mask, 8 ** -0.5)
        expected = plans.dense(q, k, v, ctx, parts=parts, scale=8 ** -0.5, dropout=0.0, training=False, trace=None)
        torch.testing.assert_close(found, expected)
        for a, b in zip(torch.autograd.grad((found * probe).sum(), (q, k, v)),
                        torch.autograd.grad((expected * probe).sum(), (q, k, v))):
            torch.testing.assert_close(a, b)

    assert _builder_graphs(VARYING_SHAPES[:4], check=check) == 2
