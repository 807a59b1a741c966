"""How many aten operators a piece of work dispatches, views left out.

In eager mode on a GPU each such operator is a kernel launch (or host work around one): where a plan's or a
model's time hardly grows with its size, the launches, not the arithmetic, set it (results/launch-counts.md).
The count depends on the code path, not on the tensor sizes, so the CPU measures it for the GPU where both run the
same path (not where a plan's choice or a fused kernel differs by device: SDPA's).
Compiled functions are not counted: their kernels are generated, and a dispatch mode sees only what they call
outside the generated code.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpCount(TorchDispatchMode):
    """Counts the operators dispatched inside the block; views (no kernel) are left out."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func is not torch.ops.aten._unsafe_view.default:
            self.ops += 1
        return func(*args, **(kwargs or {}))


def count_ops(work: Callable[[], object]) -> int:
    """The operators ``work()`` dispatches (its autograd backward included when it calls ``backward``)."""
    with OpCount() as count:
        work()
    return count.ops


@contextmanager
def accelerator_paths() -> Iterator[None]:
    """Inside, a layer that takes another path on an accelerator than on the CPU takes the accelerator's, so that a
    count on the CPU is the GPU's: Block runs its two directions as one computation there (one after the other on
    the CPU: ``block_attention.directions_together``). SDPA's choices stay the CPU's (its masks: a few operators)."""
    from sanlab.layers import block_attention

    with mock.patch.object(block_attention, "directions_together", lambda device: True):
        yield
