"""``training.interval.DeviceInterval``: what the updates leave on the device, read in one transfer."""

import json
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sanlab.training.interval import DeviceInterval

CPU = torch.device("cpu")


def _add(interval, step, loss, norm, *, skips=False):
    interval.add(step, torch.tensor(loss, dtype=torch.float64), torch.tensor(norm), overflow_skips=skips)


def test_settle_sums_the_losses_and_starts_a_new_interval():
    interval = DeviceInterval(CPU)
    for step, loss in enumerate([2.5, 1.25, 0.125], start=1):
        _add(interval, step, loss, 1.0)
    settled = interval.settle()
    assert (settled.updates, settled.loss_sum, settled.skipped, settled.bad) == (3, 3.875, 0, None)
    assert interval.settle().updates == 0 and interval.settle().loss_sum == 0.0


def test_settle_sums_the_finite_gradient_norms_for_the_records_gnorm():
    """fp16's skipped updates (an overflowing norm) have no norm to average: left out of the sum and the count."""
    interval = DeviceInterval(CPU)
    for step, norm in enumerate([2.0, math.inf, 0.5], start=1):
        _add(interval, step, 1.0, norm, skips=True)
    settled = interval.settle()
    assert (settled.gnorm_sum, settled.gnorm_updates, settled.skipped) == (2.5, 2, 1)
    assert (interval.settle().gnorm_sum, interval.settle().gnorm_updates) == (0.0, 0)


def test_an_interval_restored_after_a_cut_sums_as_the_uninterrupted_one():
    """``sanlab train --stop-after`` reads the interval at the cut and saves it; the next session restores it. The
    sums then round as one interval's: added on the host to the next one's, they would not ((0.1 + 0.2) + 0.3 is
    not 0.1 + (0.2 + 0.3) in floats)."""
    from dataclasses import asdict

    straight = DeviceInterval(CPU)
    for step, loss in enumerate([0.1, 0.2, 0.3], start=1):
        _add(straight, step, loss, loss, skips=True)
    _add(straight, 4, 0.0, math.inf, skips=True)  # an fp16 overflow: skipped, its norm left out
    expected = straight.settle()
    cut = DeviceInterval(CPU)
    _add(cut, 1, 0.1, 0.1)
    carried = {k: v for k, v in asdict(cut.settle()).items() if k != "bad"}
    resumed = DeviceInterval(CPU)
    resumed.restore(carried)
    for step, loss in ((2, 0.2), (3, 0.3)):
        _add(resumed, step, loss, loss, skips=True)
    _add(resumed, 4, 0.0, math.inf, skips=True)
    assert resumed.settle() == expected
    assert expected.loss_sum != 0.1 + (0.2 + 0.3 + 0.0)  # what adding on the host would have given
    other = DeviceInterval(CPU)
    other.restore(carried, main=False)  # another process of a torchrun job: the loss sum is process 0's
    assert (other.updates, float(other.settle().loss_sum)) == (1, 0.0)


def test_the_first_non_finite_value_is_named_with_its_update_and_value():
    interval = DeviceInterval(CPU)
    _add(interval, 7, 1.0, 1.0)
    _add(interval, 8, 1.0, math.inf)      # the norm goes first
    _add(interval, 9, math.nan, math.nan)  # later ones do not replace it
    what, step, value = interval.settle().bad
    assert (what, step, value) == ("gradient norm", 8, math.inf)
    _add(interval, 10, math.nan, 1.0)
    what, step, value = interval.settle().bad
    assert (what, step) == ("loss", 10) and math.isnan(value)


def test_with_a_loss_scaler_a_non_finite_norm_is_a_skipped_update_not_an_error():
    interval = DeviceInterval(CPU)
    _add(interval, 1, 1.0, math.inf, skips=True)
    _add(interval, 2, 1.0, 2.0, skips=True)
    _add(interval, 3, 1.0, math.nan, skips=True)
    settled = interval.settle()
    assert (settled.skipped, settled.bad) == (2, None)


def test_a_norm_on_another_device_is_taken_as_it_is():
    """``clip_grad_norm_`` of no gradients is a CPU tensor whatever the device; the meta device stands for CUDA."""
    interval = DeviceInterval(torch.device("meta"))
    interval.add(1, torch.zeros((), dtype=torch.float64, device="meta"), torch.tensor(0.0), overflow_skips=False)
    assert interval.updates == 1


def _two_processes(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        interval = DeviceInterval(CPU, distributed=True)
        # this process's share of each update's loss; the same norms on both (DDP made the gradients equal)
        _add(interval, 1, 1.0 + rank, math.inf, skips=True)  # an fp16 overflow: skipped once, not once per process
        _add(interval, 2, 0.5, 1.0, skips=True)
        first = interval.settle()
        _add(interval, 3, 1.0, 1.0)
        _add(interval, 4, math.nan if rank == 1 else 1.0, 1.0)  # one process's loss goes bad
        second = interval.settle()
        with open(f"{out}.{rank}", "w") as f:
            json.dump({"loss": first.loss_sum, "skipped": first.skipped, "bad": first.bad,
                       "bad2": [second.bad[0], second.bad[1], str(second.bad[2])]}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes that import torch: ~5 s
def test_under_torchrun_the_loss_is_summed_over_processes_and_all_of_them_stop_alike(tmp_path):
    mp.spawn(_two_processes, args=(str(tmp_path / "store"), str(tmp_path / "out")), nprocs=2)
    results = [json.loads((tmp_path / f"out.{rank}").read_text()) for rank in (0, 1)]
    assert results[0] == results[1]
    assert results[0] == {"loss": pytest.approx(4.0), "skipped": 1, "bad": None, "bad2": ["loss", 4, "nan"]}
