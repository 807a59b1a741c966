"""The mixed-precision reference itself (``amp_reference``): it passes a module that is right under autocast and
flags modules that are wrong there: an fp16 overflow, positions rounded to bf16, a gradient autocast cuts off."""

import pytest
import torch
from torch import nn

from amp_reference import (UNIT_ROUNDOFF, amp_mismatches, assert_matches_fp32, autocast_runs, smooth_relu,
                           tolerance)

WIDTH = 8


def _x(length: int = 5) -> torch.Tensor:
    return torch.randn(2, length, WIDTH, generator=torch.Generator().manual_seed(1))


class Correct(nn.Module):
    """Projections, a LayerNorm and a softmax over positions: what autocast is made for."""

    def __init__(self):
        super().__init__()
        self.inner, self.norm = nn.Linear(WIDTH, 2 * WIDTH), nn.LayerNorm(2 * WIDTH)
        self.outer = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        h = self.norm(self.inner(x))
        return self.outer(torch.softmax(h, dim=1) * h)


class Fp16Energy(Correct):
    """Adds its features' energy, squared in fp16 under autocast (to save memory, say): the squares of 16 features
    of ~100 sum past fp16's largest finite value, 65504, where fp32 has room."""

    def forward(self, x):
        h = self.inner(x) * 200.0
        low = h.to(torch.float16) if torch.is_autocast_enabled(x.device.type) else h
        return self.outer(h) + 1e-6 * low.pow(2).sum(-1, keepdim=True).float()  # fp16: inf


class LowPositions(Correct):
    """Makes its positions in the activations' dtype: under bf16 autocast 257 is 256 (8 significant bits), so the
    later positions' sinusoids are wrong, by O(1)."""

    def forward(self, x):
        h = self.inner(x)
        positions = torch.arange(x.shape[1], dtype=h.dtype, device=x.device)[None, :, None]
        return self.outer(h + torch.sin(positions * 0.5))


class DetachedUnderAutocast(Correct):
    """Detaches a branch under autocast (a cached low-precision copy used as a constant): its weights get no
    gradient there, only in fp32."""

    def forward(self, x):
        h = self.inner(x)
        if torch.is_autocast_enabled(x.device.type):
            h = h.detach()
        return self.outer(h)


class GramEnergy(Correct):
    """Adds the Gram matrix of its features, which fp16 autocast computes in fp16: 16 products of ~200^2 sum past
    65504. Nothing in the module casts; autocast does (CUDA only: CPU autocast has no fp16 here)."""

    def forward(self, x):
        h = self.inner(x) * 200.0
        return self.outer(h) + 1e-6 * (h @ h.transpose(-1, -2)).float().sum(-1, keepdim=True)


def test_a_module_right_under_autocast_passes_and_was_rounded():
    torch.manual_seed(0)
    found = assert_matches_fp32(Correct(), (_x(),))
    assert set(found.errors) == {"output", "input 0", "inner.weight", "inner.bias", "norm.weight", "norm.bias",
                                 "outer.weight", "outer.bias"}
    # autocast did act (a check that compared fp32 with fp32 would pass anything), within a few roundings
    assert 0 < found.errors["output"] <= tolerance(torch.bfloat16)["output"]
    assert max(found.errors.values()) < 8 * UNIT_ROUNDOFF[torch.bfloat16]


def test_an_fp16_overflow_is_flagged_as_non_finite():
    torch.manual_seed(0)
    module = Fp16Energy()
    with torch.no_grad():
        assert torch.isfinite(module(_x())).all()  # fine in fp32
    found = amp_mismatches(module, (_x(),))
    assert not found.ok
    assert any(p.startswith("output: ") and "not finite under bfloat16 autocast" in p for p in found.problems)
    with pytest.raises(AssertionError, match="not finite"):
        assert_matches_fp32(module, (_x(),))


def test_positions_rounded_to_bf16_are_flagged_beyond_the_tolerance():
    torch.manual_seed(0)
    found = amp_mismatches(LowPositions(), (_x(length=600),))
    assert any(p.startswith("output differs from fp32 by") for p in found.problems), found.problems
    assert found.errors["output"] > 3 * tolerance(torch.bfloat16)["output"]
    # the same module over positions bf16 holds exactly (< 256) is right: the helper does not flag rounding itself
    assert amp_mismatches(LowPositions(), (_x(length=200),)).ok


@pytest.mark.gpu
@pytest.mark.skipif(not autocast_runs("cuda", torch.float16), reason="needs a CUDA device (torch sees none)")
def test_an_fp16_autocast_overflow_is_flagged_on_cuda_and_bf16_passes():
    torch.manual_seed(0)
    module, x = GramEnergy().cuda(), _x().cuda()
    found = amp_mismatches(module, (x,), device_type="cuda", dtype=torch.float16)
    assert any("not finite under float16 autocast" in p for p in found.problems), found.problems
    assert_matches_fp32(module, (x,), device_type="cuda", dtype=torch.bfloat16)  # bf16 has fp32's range


def test_a_gradient_in_one_run_only_is_flagged():
    torch.manual_seed(0)
    found = amp_mismatches(DetachedUnderAutocast(), (_x(),))
    assert "inner.weight: a gradient in the fp32 run only" in found.problems
    assert "inner.bias: a gradient in the fp32 run only" in found.problems


def test_the_reference_refuses_what_it_cannot_compare():
    with pytest.raises(ValueError, match="give the module in fp32"):
        amp_mismatches(Correct().double(), (_x().double(),))
    with pytest.raises(ValueError, match="no mixed-precision reference for torch.float64"):
        tolerance(torch.float64)
    with pytest.raises(TypeError, match="forward must return one tensor"):
        amp_mismatches(Correct(), (_x(),), forward=lambda m, x: (m(x), x))


def test_tolerances_are_multiples_of_each_formats_roundoff():
    bf16, fp16 = tolerance(torch.bfloat16), tolerance(torch.float16)
    assert bf16["output"] / fp16["output"] == bf16["grad"] / fp16["grad"] == 8  # 8 against 11 significant bits
    assert bf16["output"] < bf16["grad"] < 0.1
    assert autocast_runs("cpu", torch.bfloat16)


def test_smooth_relu_is_softplus_inside_and_relu_after():
    x = torch.tensor([-1.0, 0.0, 2.0])
    with smooth_relu():
        torch.testing.assert_close(torch.relu(x), torch.nn.functional.softplus(x))
    assert torch.equal(torch.relu(x), torch.tensor([0.0, 0.0, 2.0]))
    with pytest.raises(RuntimeError), smooth_relu():  # restored when the check inside fails too
        raise RuntimeError
    assert torch.equal(torch.relu(x), torch.tensor([0.0, 0.0, 2.0]))
