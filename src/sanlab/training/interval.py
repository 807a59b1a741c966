"""What the updates since the last host read leave on the device, read in one transfer.

An update's loss and gradient norm are tensors on the training device. Reading either on the host (``float(t)``,
a Python ``if`` on it) makes the host wait until the device has finished the update, and the device then idles
while Python prepares the next one. So an update only *adds* them here, on the device: the loss sum, the first
update whose loss or gradient norm was not finite (and that value), the sum of the finite gradient norms (the
"train" record's mean ``gnorm``, as fairseq logs it), and, under fp16, the updates the loss scaler skipped. The loop reads them (``settle``) every ``log_every`` updates, before a validation and at the end of a
session: one host read and, under torchrun, two collectives, instead of a read and a collective per update.

A non-finite loss or gradient is therefore found up to ``log_every`` updates late. Nothing is lost by that: the
loop settles before it validates or saves, so the updates after the bad one are never saved, and the error
names the update that went bad and the last good checkpoint, as when it was found at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

NONE = 2 ** 62  # "no update went bad": above any step, exact in float64 (read as one), kept by a minimum
WATCHED = ("loss", "gradient norm")


@dataclass(frozen=True)
class Settled:
    """The host's view of an interval, the same on every process."""

    updates: int
    loss_sum: float            # the per-token losses of the interval's updates, summed over them and processes
    skipped: int               # fp16: updates the loss scaler skipped (their gradients overflowed)
    bad: tuple[str, int, float] | None  # (what, update, value) of the first non-finite loss or gradient norm
    gnorm_sum: float = 0.0     # the finite gradient norms (before clipping) of the interval's updates, summed
    gnorm_updates: int = 0     # how many there were (fp16's skipped updates have none)


class DeviceInterval:
    def __init__(self, device: torch.device, *, distributed: bool = False):
        self.device, self.distributed = device, distributed
        # made once: a tensor built from Python values per update would be a host-to-device copy each time
        self._loss_only = torch.tensor([True, False], device=device)
        self.reset()

    def reset(self) -> None:
        self.updates = 0
        self._loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self._skipped = torch.zeros((), dtype=torch.float64, device=self.device)
        self._gnorm = torch.zeros(2, dtype=torch.float64, device=self.device)  # the finite norms' sum, their number
        self._first = torch.full((len(WATCHED),), NONE, dtype=torch.int64, device=self.device)
        self._value = torch.zeros(len(WATCHED), dtype=torch.float64, device=self.device)

    def add(self, step: int, loss: Tensor, grad_norm: Tensor, *, overflow_skips: bool) -> None:
        """Record update ``step``: ``loss`` its per-token loss (this process's share), ``grad_norm`` the norm
        before clipping. With ``overflow_skips`` (fp16's loss scaler) a non-finite norm is a skipped update,
        not an error."""
        self.updates += 1
        self._loss += loss
        # (the norm is a CPU tensor when no parameter has a gradient)
        values = torch.stack([loss.to(torch.float64), grad_norm.detach().to(self.device, torch.float64)])
        bad = ~torch.isfinite(values)
        self._gnorm += torch.stack([torch.where(bad[1], 0.0, values[1]), (~bad[1]).to(torch.float64)])
        if overflow_skips:
            self._skipped += bad[1]
            bad = bad & self._loss_only
        new = bad & (self._first == NONE)
        self._first = torch.where(new, step, self._first)
        self._value = torch.where(new, values, self._value)

    def settle(self) -> Settled:
        """Read the interval (one host read; under torchrun summed over processes) and start a new one."""
        loss, first = self._loss.clone(), self._first.clone()
        if self.distributed:  # each process has its share of the loss; the gradients, so the norms, are the same
            dist.all_reduce(loss)  # (and so are the skipped updates: not summed, which would count each N times)
            dist.all_reduce(first, op=dist.ReduceOp.MIN)
        # the loss, the skipped updates, the gradient norms (the same on every process: the gradients are), the first
        # bad update of each watched value: one transfer
        loss_sum, skipped, gnorm_sum, gnorm_updates, *firsts = torch.cat(
            [loss[None], self._skipped[None], self._gnorm, first.to(torch.float64)]).tolist()
        bad = None
        if any(f != NONE for f in firsts):  # stopping: the extra reads and collective cost nothing that matters
            which = min(range(len(WATCHED)), key=lambda i: firsts[i])
            step = int(firsts[which])
            value = torch.where(self._first[which] == step, self._value[which], 0.0)
            if self.distributed:
                dist.all_reduce(value)  # the value of the process(es) that saw it; a NaN stays NaN
            bad = (WATCHED[which], step, float(value))
        updates = self.updates
        self.reset()
        return Settled(updates=updates, loss_sum=loss_sum, skipped=int(skipped), bad=bad, gnorm_sum=gnorm_sum,
                       gnorm_updates=int(gnorm_updates))

    def restore(self, carried: dict, *, main: bool = True) -> None:
        """Start the interval where a session cut between two reads (``sanlab train --stop-after``) left it:
        ``carried`` is what ``settle`` read then (``Settled``'s finite fields). The next read then sums the same
        float64 values in the same order as an uninterrupted run (adding them to the "train" record's sums on the
        host instead would round them otherwise). The loss sum is summed over processes by ``settle``: it goes to
        the ``main`` process only; the rest is the same on every process."""
        self.reset()
        self.updates = int(carried["updates"])
        if main:
            self._loss.fill_(float(carried["loss_sum"]))
        self._skipped.fill_(float(carried["skipped"]))
        self._gnorm.copy_(torch.tensor([float(carried["gnorm_sum"]), float(carried["gnorm_updates"])],
                                       dtype=torch.float64))
