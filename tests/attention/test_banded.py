"""The banded plan equals the dense masked reference, never forms i x j, and is chosen by length."""

import itertools

import pytest
import torch
from torch.overrides import TorchFunctionMode

from sanlab.attention import Attention, AttentionContext, AttentionPart, Positions, banded, plans
from sanlab.attention.parts.csan2d import HeadArea
from sanlab.attention.parts.window import WindowMask
from sanlab.attention.plans import StageParts
from sanlab.torch_release import TORCH

from tests_helpers import spy_plans


def _part(kind: str, m: int, *, boundary: str = "wrap", area: int = 3, causal_window: str = "half") -> AttentionPart:
    if kind == "1d":
        return WindowMask(half_width=m, causal_window=causal_window)
    return HeadArea(half_width=m, area=area, boundary=boundary, causal_window=causal_window)


def _pair(part: AttentionPart, *, heads: int = 4) -> tuple[Attention, Attention]:
    dense = Attention(dim=4 * heads, heads=heads, parts=[part], plan="dense").double()
    fast = Attention(dim=4 * heads, heads=heads, parts=[part], plan="banded").double()
    fast.load_state_dict(dense.state_dict())
    return dense, fast


def _valid(length: int) -> torch.Tensor:
    lengths = torch.tensor([length, max(1, length - 3), 1])
    return torch.arange(length)[None, :] < lengths[:, None]  # [3, i]


PARTS_GRID = [("1d", m, "wrap", "half") for m in (0, 1, 2, 6)] + [("1d", 2, "wrap", "full")] + [
    ("2d", m, boundary, cw) for m, boundary, cw in itertools.product((1, 2), ("wrap", "clip", "reference"),
                                                                       ("half", "full"))]


@pytest.mark.parametrize("block", [1, 3, 16])
@pytest.mark.parametrize("length", [1, 5, 11])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind, m, boundary, causal_window", PARTS_GRID)
def test_banded_equals_dense_values_and_gradients(kind, m, boundary, causal_window, causal, length, block,
                                                  monkeypatch):
    monkeypatch.setattr(banded, "BLOCK", block)
    pos = Positions.self_attention(_valid(length), length=length, causal=causal)
    part = _part(kind, m, boundary=boundary, causal_window=causal_window)
    _assert_banded_equals_dense(part, pos, seed=length * 7 + m)


@pytest.mark.parametrize("length", [11, 12])  # 12: blocks of 3 fit, so a zero-width window has no slot outside
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind, m, boundary, causal_window", PARTS_GRID)
def test_banded_equals_dense_without_padding(kind, m, boundary, causal_window, causal, length, monkeypatch):
    """No key padding: the plan masks only the window and the span slots past either end of the sentence (none
    at all for a zero-width window over whole blocks: the plan then builds no key mask)."""
    monkeypatch.setattr(banded, "BLOCK", 3)
    _assert_banded_equals_dense(_part(kind, m, boundary=boundary, causal_window=causal_window),
                                Positions.self_attention(None, length=length, causal=causal), seed=m, batch=2)


@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_an_empty_batch_gives_what_dense_gives(kind):
    dense, fast = _pair(_part(kind, 1, boundary="clip"))
    outs = []
    with spy_plans() as ran:
        for attn in (dense, fast):
            x = torch.randn(2, 0, 16, dtype=torch.float64, requires_grad=True)
            out = attn(x, positions=Positions.self_attention(torch.ones(2, 0, dtype=torch.bool), length=0)).output
            out.sum().backward()
            outs.append((out.shape, x.grad.shape))
    assert ran == ["dense", "banded"]
    assert outs[0] == outs[1] == ((2, 0, 16), (2, 0, 16))


def _assert_banded_equals_dense(part: AttentionPart, pos: Positions, *, seed: int, batch: int = 3) -> None:
    dense, fast = _pair(part)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, pos.q_pos.shape[0], 16, generator=g, dtype=torch.float64)
    probe = torch.randn(x.shape, generator=g, dtype=torch.float64)
    grads = []
    with spy_plans() as ran:
        for attn in (dense, fast):
            attn.zero_grad()
            xi = x.clone().requires_grad_(True)
            out = attn(xi, positions=pos).output
            (out * probe).sum().backward()
            grads.append((out, xi.grad, [p.grad.clone() for p in attn.parameters()]))
    assert ran == ["dense", "banded"]  # the banded plan ran: not dense compared with itself
    (out_d, dx_d, dp_d), (out_b, dx_b, dp_b) = grads
    torch.testing.assert_close(out_b, out_d)
    torch.testing.assert_close(dx_b, dx_d)
    for a, b in zip(dp_b, dp_d):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_cached_decoding_attends_to_the_window_of_cached_keys(kind, monkeypatch):
    monkeypatch.setattr(banded, "BLOCK", 2)
    dense, fast = _pair(_part(kind, 2, boundary="clip"))
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    valid = torch.tensor([[True] * 9, [True] * 6 + [False] * 3])
    full = dense(x, positions=Positions.self_attention(valid, length=9, causal=True)).output
    cache, steps, start = None, [], 0
    with spy_plans() as ran:
        for size in (4, 1, 3, 1):  # a prompt of 4 queries at positions 0..3, then more
            pos = Positions.self_attention(valid[:, :start + size], length=size, offset=start, causal=True)
            r = fast(x[:, start:start + size], positions=pos, cache=cache, use_cache=True)
            cache, start = r.cache, start + size
            steps.append(r.output)
    assert ran == ["banded"] * 4  # every step, single queries included, ran the banded plan
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def _plan_inputs(*, length: int, key_valid: torch.Tensor | None, heads: int = 2, d: int = 3,
                 dtype: torch.dtype = torch.float64):
    q, k, v = (torch.randn(key_valid.shape[0] if key_valid is not None else 1, heads, length, d,
                           dtype=dtype, requires_grad=True) for _ in range(3))
    ctx = AttentionContext(positions=Positions.self_attention(key_valid, length=length), heads=heads, head_dim=d)
    return q, k, v, ctx


@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_rows_without_visible_keys_are_zero_not_nan(kind):
    part = _part(kind, 1, boundary="clip")
    key_valid = torch.tensor([[True, True, False, False, False, False, False],   # queries 3..6: padding only
                              [False] * 7])                                        # nothing visible at all
    q, k, v, ctx = _plan_inputs(length=7, key_valid=key_valid, heads=3)
    out = banded.attend(q, k, v, ctx, parts=StageParts.sort([part]), scale=1.0, dropout=0.0, training=False,
                        block=3)  # [b, h, i, d], before the attention zeroes padded query rows
    assert torch.all(out[0, :, 3:] == 0) and torch.all(out[1] == 0)
    assert torch.all(out[0, :, :3].abs().sum(-1) > 0)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


class _LargestTensor(TorchFunctionMode):
    """Records the largest tensor any torch function returns inside the block."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for t in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return result


@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_never_forms_an_i_by_j_matrix(kind):
    length, heads, d, block, m = 256, 3, 2, 8, 2
    q, k, v, ctx = _plan_inputs(length=length, key_valid=torch.ones(1, length, dtype=torch.bool), heads=heads, d=d)
    area = 1 if kind == "1d" else 3
    parts = StageParts.sort([_part(kind, m, area=area)])
    with _LargestTensor() as probe:
        out = banded.attend(q, k, v, ctx, parts=parts, scale=1.0, dropout=0.0, training=False, block=block)
    span = block + 2 * m
    # the largest tensors are the scores [b, h, i, n*span] and the key spans [b, h, i/c, n*span, d]
    assert probe.numel <= heads * length * area * span * max(d, 1)
    assert probe.numel < heads * length * length / 4
    assert out.shape == (1, heads, length, d)


class _Score(AttentionPart):
    def score(self, scores, ctx):
        return scores


def test_auto_chooses_banded_by_length_and_dense_for_traces():
    attn = Attention(dim=16, heads=4, parts=[_part("2d", 2)]).eval()
    short, long = banded.MIN_KEYS - 1, banded.MIN_KEYS
    with spy_plans() as ran:
        attn(torch.randn(1, short, 16), positions=Positions.self_attention(None, length=short))
        attn(torch.randn(1, long, 16), positions=Positions.self_attention(None, length=long))
        attn(torch.randn(1, long, 16), positions=Positions.self_attention(None, length=long), need_trace=True)
    # 2D-CSAN extends the keys: dense below the threshold (sdpa cannot run it), banded from it, dense for a trace
    assert ran == ["dense", "banded", "dense"]


def test_only_window_local_parts_are_banded():
    assert "banded" in plans.runnable(StageParts.sort([_part("1d", 1)]))
    assert "banded" in plans.runnable(StageParts.sort([_part("1d", 1), _part("2d", 2)]))
    assert "banded" not in plans.runnable(StageParts.sort([]))
    assert "banded" not in plans.runnable(StageParts.sort([_part("1d", 1), _Score()]))
    with pytest.raises(ValueError, match="plan 'banded' needs window-local parts only.*_Score"):
        Attention(dim=16, heads=4, parts=[_part("1d", 1), _Score()], plan="banded")


def test_intersection_of_two_windows_is_the_narrower_band():
    parts = StageParts.sort([_part("1d", 3), _part("1d", 1, causal_window="full")])
    assert banded.describe(parts, heads=4, causal=False) == banded.Band(1, 1)
    assert banded.describe(parts, heads=4, causal=True) == banded.Band(2, 0)  # min(3, 2*1) left, causal right


def test_positions_outside_the_self_attention_layout_are_refused():
    q, k, v, _ = _plan_inputs(length=5, key_valid=None)
    shifted = AttentionContext(positions=Positions(q_pos=torch.arange(5), k_pos=torch.arange(5) + 2), heads=2,
                               head_dim=3)
    with pytest.raises(ValueError, match=r"key j at position j.*k_pos \[2, 3, 4, 5, 6\]"):
        banded.attend(q, k, v, shifted, parts=StageParts.sort([_part("1d", 1)]), scale=1.0, dropout=0.0,
                      training=False)


def test_plan_banded_for_a_whole_stack_leaves_layers_without_parts_dense():
    # `plan: banded` applies to every layer of a stack; layers the window part skips have nothing to band
    plain = Attention(dim=16, heads=4, plan="banded").eval()
    assert "banded" not in plans.runnable(plain.stage_parts)
    reference = Attention(dim=16, heads=4, plan="dense").eval()
    reference.load_state_dict(plain.state_dict())
    x = torch.randn(2, 5, 16)
    pos = Positions.self_attention(None, length=5)
    with spy_plans() as ran:
        torch.testing.assert_close(plain(x, positions=pos).output, reference(x, positions=pos).output)
    assert ran == ["dense", "dense"]


@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_attention_dropout_sits_where_the_dense_plan_puts_it(kind, monkeypatch):
    """Dropout of the attention weights (after the softmax, before the values, scaled by 1/(1-p)): a random mask
    cannot be compared across the two layouts, so ``F.dropout`` is made the deterministic scaling it is in
    expectation, and the two plans must agree in training mode in values and gradients (and differ from eval)."""
    import torch.nn.functional as F

    monkeypatch.setattr(F, "dropout", lambda x, p=0.5, training=True, inplace=False: x / (1 - p) if training and p
                        else x)
    part = _part(kind, 2)
    dense = Attention(dim=16, heads=4, parts=[part], plan="dense", dropout=0.3).double().train()
    fast = Attention(dim=16, heads=4, parts=[part], plan="banded", dropout=0.3).double().train()
    fast.load_state_dict(dense.state_dict())
    valid = _valid(11)
    x = torch.randn(3, 11, 16, dtype=torch.float64, requires_grad=True)
    positions = Positions.self_attention(valid, length=11, causal=False)
    with spy_plans() as ran:
        want, got = dense(x, positions=positions).output, fast(x, positions=positions).output
    assert ran == ["dense", "banded"]
    torch.testing.assert_close(got, want)
    grads = [torch.autograd.grad(out[valid].sum(), x)[0] for out in (want, got)]
    torch.testing.assert_close(grads[1], grads[0])
    assert (got - dense.eval()(x, positions=positions).output)[valid].abs().max() > 1e-3  # dropout did run


@pytest.mark.slow  # inductor compiles a forward and a backward graph per window kind (~10-15 s each here)
@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_the_compiled_plan_equals_the_eager_one(kind):
    """``train.compile: true`` runs this plan under torch.compile: the same values and gradients as eager."""
    parts = StageParts.sort([_part(kind, 2, boundary="wrap")])
    key_valid = torch.arange(37)[None, :] < torch.tensor([37, 30])[:, None]  # padding, and spans past both ends
    # torch 2.5's CPU inductor writes C++ for float64 that g++ refuses (fmadd over VectorizedN<double, 2>): there,
    # float32, which is what a model runs in anyway
    dtype = torch.float64 if TORCH >= (2, 6) else torch.float32
    q, k, v, ctx = _plan_inputs(length=37, key_valid=key_valid, heads=3, d=4, dtype=dtype)

    def attend(q, k, v):
        return banded.attend(q, k, v, ctx, parts=parts, scale=0.5, dropout=0.0, training=False, block=8)

    results = []
    for run in (attend, torch.compile(attend, dynamic=False)):
        out = run(q, k, v)
        results.append((out, torch.autograd.grad((out * out).sum(), (q, k, v))))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)
