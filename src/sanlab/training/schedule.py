"""Learning-rate schedules as plain functions of the update number (1-based)."""

from __future__ import annotations

import math


def learning_rate(step: int, *, kind: str, lr: float, warmup_steps: int, warmup_init_lr: float) -> float:
    """``inverse_sqrt``: linear warm-up to ``lr``, then lr * sqrt(warmup / step) (Vaswani et al. 2017, 5.3,
    in fairseq's parameterisation by the peak rate). ``constant``: the same warm-up, then ``lr``."""
    if warmup_steps > 0 and step < warmup_steps:
        return warmup_init_lr + (lr - warmup_init_lr) * step / warmup_steps
    if kind == "constant":
        return lr
    if kind == "inverse_sqrt":
        return lr * math.sqrt(max(warmup_steps, 1) / max(step, 1))
    raise ValueError(f"unknown schedule {kind!r}")
