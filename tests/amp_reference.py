"""The mixed-precision reference (imported as ``amp_reference``; tests/ is on sys.path via conftest): a module's
forward and backward under ``torch.autocast`` (bf16, or fp16 where the device runs it) against the same module's
fp32 forward and backward, from the same weights and inputs.

    amp_mismatches(module, inputs, forward=..., device_type="cpu", dtype=torch.bfloat16) -> AmpComparison
    assert_matches_fp32(...)                                       the same, raising with every problem found

Both runs take one loss, ``sum(output.float() * probe)`` with a fixed random ``probe`` computed outside autocast,
so the gradient that enters the backward is the same in both, and every difference in the gradients comes from the
module's own arithmetic. Compared: the output, the gradient of every floating input and of every parameter, each
as a relative error in norm (``||amp - fp32|| / ||fp32||``): single entries of a sum can cancel to near zero, where
an entrywise tolerance fails on them whatever their noise (``tests_helpers.assert_close_in_norm`` says the same).

What counts as wrong: a non-finite value under autocast (fp32 finite), a gradient present in one run only, or a
relative error beyond ``tolerance(dtype)``. The tolerances are multiples of the format's unit roundoff u
(bf16: 8 significant bits, u = 2^-8; fp16: 11 bits, u = 2^-11), justified where they are defined. A module that
keeps something in fp32 that must be (a softmax, a position, a routing) stays well inside them; one that computes
a step in the low precision where the fp32 reference depends on its extra bits (an fp16 overflow, a position
rounded to 8 bits) lands outside, as does a gradient autocast cuts off. ``tests/test_amp_reference.py`` checks these.

relu: its derivative jumps at 0, so a pre-activation within rounding distance of 0 flips between passing all of
its gradient and none under autocast: an O(1) difference in that unit that no multiple of u bounds, and a
comparison that passes or fails by the seed. With relu, 20 of tests/test_mixed_precision.py's 104 CPU cases failed
(2026-12), each on the gradients of the weights before a relu (FFN, conv pre-block) and of the norms around them,
6-14 % off; with softplus all pass within 5 u. ``smooth_relu`` swaps ``torch.relu`` for softplus, whose derivative
(a sigmoid) moves by O(u) when its input does, for the time of a check: the arithmetic around it (projections,
norms, softmaxes) is what the check is about.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}

# Allowed relative error in norm, as multiples of u. A tiny model rounds each matmul's inputs once (the products
# accumulate in fp32) and the outputs of the ops autocast runs low; through a few layers that is a few dozen
# roundings of relative size <= u, which add in norm roughly as sqrt(count) * u (independent signs), more where a
# layer amplifies its input's error (a softmax over sharp scores, a LayerNorm of a small variance). Measured on every
# part, mixer and pre-block example and the whole models of tests/test_mixed_precision.py (bf16 on the CPU,
# 2026-12): outputs within 2.2 u, gradients within 4.8 u. Allowed: 8 u for outputs (3 % in bf16) and 16 u for
# gradients (6 % in bf16), whose backward rounds about as often again: room for other kernels (CUDA's fused
# attention rounds its probabilities to the low format before multiplying the values), not for a step computed in
# the low format that must not be (positions past 256 in bf16, an fp16 overflow), whose errors are 0.2-1 or
# non-finite (tests/test_amp_reference.py).
OUTPUT_ULPS, GRAD_ULPS = 8, 16
# A gradient that is zero in exact arithmetic (a bias every key of a softmax row shares: the key projection's) is
# rounding noise in both runs, of the size of u times the terms that cancel. Its error is measured against this
# share of the largest parameter gradient's norm instead of its own (near-zero) norm.
ZERO_GRADIENT_FLOOR = 0.05


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """The relative errors in norm allowed under autocast to ``dtype``: {"output": ..., "grad": ...}."""
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"no mixed-precision reference for {dtype}; use torch.bfloat16 or torch.float16")
    u = UNIT_ROUNDOFF[dtype]
    return {"output": OUTPUT_ULPS * u, "grad": GRAD_ULPS * u}


def autocast_runs(device_type: str, dtype: torch.dtype) -> bool:
    """Whether autocast to ``dtype`` runs on this device type here (fp16 needs CUDA or a torch whose CPU autocast
    has it; bf16 on CUDA needs a device that supports it)."""
    if device_type == "cuda":
        return torch.cuda.is_available() and (dtype != torch.bfloat16 or torch.cuda.is_bf16_supported())
    return torch.amp.autocast_mode.is_autocast_available(device_type) and dtype in (torch.bfloat16, torch.float16)


@contextlib.contextmanager
def smooth_relu() -> Iterator[None]:
    """``torch.relu`` (what sanlab's FFN, conv pre-block, convolved attention and char-CNN call) is softplus inside:
    see the module docstring for why."""
    real = torch.relu
    torch.relu = F.softplus
    try:
        yield
    finally:
        torch.relu = real


@dataclass
class AmpComparison:
    """What one check found: ``errors`` (name -> relative error in norm) and ``problems`` (sentences)."""

    dtype: torch.dtype
    errors: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def worst(self) -> tuple[str, float]:
        """The compared tensor furthest from fp32 and its error (("", 0.0) when nothing was compared)."""
        return max(self.errors.items(), key=lambda item: item[1], default=("", 0.0))


@contextlib.contextmanager
def _full_fp32() -> Iterator[None]:
    """The reference in full fp32: cuDNN's convolutions (the conv pre-block's) default to TF32 on CUDA, 10 bits of
    mantissa, as coarse as fp16's unit roundoff."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


def _default_forward(module: nn.Module, *inputs):
    return module(*inputs)


def _run(module: nn.Module, inputs: tuple, forward: Callable, probe: Tensor | None, *, device_type: str,
         dtype: torch.dtype | None) -> tuple[Tensor, dict[str, Tensor | None], Tensor]:
    """One forward and backward, under autocast to ``dtype`` (the backward outside it, as a training step runs it) or,
    with None, all in fp32: (output in fp32, {name: gradient}, the probe used)."""
    module.zero_grad(set_to_none=True)
    leaves = tuple(x.detach().clone().requires_grad_(True) if isinstance(x, Tensor) and x.is_floating_point() else x
                   for x in inputs)
    with _full_fp32() if dtype is None else contextlib.nullcontext():
        with torch.autocast(device_type, dtype=dtype) if dtype is not None else contextlib.nullcontext():
            out = forward(module, *leaves)
        if not isinstance(out, Tensor):
            raise TypeError(f"forward must return one tensor; got {type(out).__name__} (pick the output to compare)")
        out = out.float()
        if probe is None:  # fixed by the fp32 run, so both losses weigh the outputs alike
            probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1234)).to(out.device)
        (out * probe).sum().backward()
    grads = {f"input {n}": x.grad for n, x in enumerate(leaves) if isinstance(x, Tensor) and x.requires_grad}
    grads.update({name: p.grad for name, p in module.named_parameters()})
    return out.detach(), grads, probe


def _relative(actual: Tensor, expected: Tensor, scale: float) -> float:
    return (actual.float() - expected.float()).norm().item() / max(scale, 1e-30)


def amp_mismatches(module: nn.Module, inputs: tuple, *, forward: Callable = _default_forward, device_type: str = "cpu",
                   dtype: torch.dtype = torch.bfloat16) -> AmpComparison:
    """``forward(module, *inputs)`` (default ``module(*inputs)``, one tensor) under autocast to ``dtype`` against
    its fp32 run. ``module`` is fp32, on ``device_type``, without dropout (``eval()``, or rates of 0): both runs
    must compute the same function. Floating ``inputs`` get gradients, others (token ids, masks) are passed as
    they are."""
    limits = tolerance(dtype)
    found = AmpComparison(dtype)
    if any(p.dtype != torch.float32 for p in module.parameters()):
        raise ValueError("the reference run is fp32: give the module in fp32 (autocast casts what it casts)")
    reference, reference_grads, probe = _run(module, inputs, forward, None, device_type=device_type, dtype=None)
    low, low_grads, _ = _run(module, inputs, forward, probe, device_type=device_type, dtype=dtype)
    name = str(dtype).removeprefix("torch.")
    if not torch.isfinite(reference).all():
        raise ValueError("the fp32 output is not finite: nothing to compare against")
    bad = (~torch.isfinite(low)).sum().item()
    if bad:
        found.problems.append(f"output: {bad} of {low.numel()} values are not finite under {name} autocast "
                              "(finite in fp32)")
    else:
        found.errors["output"] = error = _relative(low, reference, reference.norm().item())
        if error > limits["output"]:
            found.problems.append(f"output differs from fp32 by {error:.3g} of its norm under {name} autocast "
                                  f"(allowed {limits['output']:.3g})")
    largest = max((g.float().norm().item() for g in reference_grads.values() if g is not None), default=0.0)
    for key, expected in reference_grads.items():
        actual = low_grads[key]
        if (actual is None) != (expected is None):
            found.problems.append(f"{key}: a gradient in the {'fp32' if actual is None else name} run only")
            continue
        if expected is None:
            continue
        bad = (~torch.isfinite(actual)).sum().item()
        if bad:
            found.problems.append(f"{key}: {bad} of {actual.numel()} gradient entries are not finite under {name} "
                                  "autocast")
            continue
        scale = max(expected.float().norm().item(), ZERO_GRADIENT_FLOOR * largest)
        found.errors[key] = error = _relative(actual, expected, scale)
        if error > limits["grad"]:
            found.problems.append(f"{key}: gradient differs from fp32 by {error:.3g} of its norm under {name} "
                                  f"autocast (allowed {limits['grad']:.3g})")
    return found


def assert_matches_fp32(module: nn.Module, inputs: tuple, **kwargs) -> AmpComparison:
    """``amp_mismatches``, failing with every problem it found; returns the comparison (its ``errors``)."""
    found = amp_mismatches(module, inputs, **kwargs)
    if found.problems:
        raise AssertionError(f"{len(found.problems)} difference(s) beyond rounding:\n  " + "\n  ".join(found.problems))
    return found


def roundings(dtype: torch.dtype, error: float) -> float:
    """``error`` in units of ``dtype``'s unit roundoff (what the tolerances count in)."""
    return error / UNIT_ROUNDOFF[dtype] if not math.isnan(error) else error
