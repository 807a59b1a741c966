"""Data-parallel training with ``torchrun`` and DistributedDataParallel (gloo on the CPU, NCCL on CUDA).

``torchrun --standalone --nproc_per_node N -m sanlab train ...`` (or ``sanlab train --nproc N``)
starts N copies of the same training; this module is what they share. Every process builds the
same epoch batch order from the seed, and each update's batches are dealt out round-robin, so one
update of N processes over ``N x accum_steps`` batches has the gradient of one process
accumulating all of them. Process 0 (the *main* process) validates, logs and writes checkpoints;
the others wait for it and take its decisions (stop or go on) from a broadcast.

A single process (no ``WORLD_SIZE`` in the environment) gets ``Distributed.single()``, whose
collectives are identities, so the training loop has one code path.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import inspect
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from sanlab.errors import SanlabError, TrainingError
from sanlab.torch_release import TORCH

T = TypeVar("T")

# The main process validates (BLEU decoding of the whole dev set) while the others wait in a
# collective: allow far longer than gloo's 30-minute default.
COLLECTIVE_TIMEOUT = timedelta(hours=4)
# How long the processes of a launch by hand (srun, mpirun, a shell per rank) wait for each other to meet at
# MASTER_ADDR:MASTER_PORT. Apart from COLLECTIVE_TIMEOUT, which would otherwise bound the meeting too: a rank whose
# rank 0 never came up (its port taken, a typo in MASTER_ADDR) waited 4 hours before saying anything.
RENDEZVOUS_TIMEOUT = timedelta(minutes=10)

# Process groups torn down but still referenced here, released when the next group is set up or at exit. A DDP
# model's C++ reducer holds its group too; were it the last holder, Python freeing the model (say, a rank unwinding
# after rank 0 failed) would run gloo's destructor with the GIL held, and that destructor joins the worker threads,
# one of which may still be freeing the last collective's tensors and need the GIL: both wait forever (seen in
# CI). Held here, the group outlives any model built on it and is freed later, its workers long idle.
_RETIRED_GROUPS: list[dist.ProcessGroup] = []
# Before torch 2.8 even that later freeing could meet a worker still freeing tensors, as gloo's destructor held the
# GIL until pytorch#154976 (2.8): on 2.5, 2.6 and 2.7 test_distributed.py's script that frees groups in turn hung,
# and on 2.6 a two-process run hung after its last checkpoint (results/torch-versions.md). There the groups are
# never freed, and at exit they get a reference that is never dropped. Later releases need the freeing: on 2.13
# a group left to the end of the process aborts it ("terminate called without an active exception").
KEEP_RETIRED_GROUPS = TORCH < (2, 8)


def _release_retired_groups() -> None:
    """Free the retired groups (before a new group is set up, and at exit), where this torch frees them safely."""
    if KEEP_RETIRED_GROUPS:
        return
    # (a model of an earlier run still alive would hold that group last again: safe only as its workers are idle)
    _RETIRED_GROUPS.clear()


def _at_exit() -> None:
    if KEEP_RETIRED_GROUPS:  # no destructor joins gloo's workers while the interpreter shuts down
        for group in _RETIRED_GROUPS:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))
    _release_retired_groups()


atexit.register(_at_exit)


def _no_buffer_sync() -> dict[str, bool]:
    """DDP's switch for broadcasting buffers in forward, by this torch's name for it: newer releases call it
    ``forward_sync_buffers`` (deprecating ``broadcast_buffers``); torch 2.5 to 2.12 know only ``broadcast_buffers``."""
    parameters = inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers" if "forward_sync_buffers" in parameters else "broadcast_buffers": False}


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")  # where this process computes; NCCL's collectives need it

    @staticmethod
    def single() -> "Distributed":
        return Distributed()

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: Sequence[T]) -> list[T]:
        """This process's share of one update's batches (round-robin, so shares differ by at most one)."""
        return list(items[self.rank::self.world_size])

    def wrap(self, model: nn.Module, *, find_unused_parameters: bool = False) -> nn.Module:
        """The module to run forward/backward through: DDP averages gradients across processes."""
        if not self.enabled:
            return model
        # Buffers are not synchronised in forward: ours never change in training, and a broadcast inside
        # a forward only the main process runs (validation) would wait forever for the others.
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **_no_buffer_sync(),
                                                   find_unused_parameters=find_unused_parameters)

    def no_sync(self, wrapped: nn.Module, sync: bool):
        """Skip DDP's gradient all-reduce for accumulation micro-batches (all but the last)."""
        if self.enabled and not sync:
            return wrapped.no_sync()
        return contextlib.nullcontext()

    def broadcast(self, value: T) -> T:
        """The main process's ``value`` on every process (any picklable object)."""
        if not self.enabled:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every process's ``value``, in rank order, on every process."""
        if not self.enabled:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Run the block on the main process first (it decides the start: locks and prepares the run directory,
        checks a resume, writes the vocabulary and the subword model), then on the others, which then find and read
        those files. The others wait for the main process's outcome in a broadcast: if it fails inside the block,
        they stop too, under any launcher (by hand, srun and mpirun stop no process; torchrun's agent would, with a
        "connection closed" traceback from each): a SanlabError with the main process's own message, and any other
        error as a ``RelayedCrash`` "process 0 stopped while starting: TYPE: MESSAGE"."""
        if not self.enabled:
            yield
            return
        if not self.is_main:
            failed = self.broadcast(None)
            if failed is not None:
                raise relayed(failed, "process 0 stopped while starting")
            yield
            return
        try:
            yield
        except Exception as err:
            self.broadcast(failure_report(err))
            raise
        self.broadcast(None)

    @contextlib.contextmanager
    def all_or_none(self, doing: str) -> Iterator[None]:
        """Run the block on every process, then gather their outcomes: if it failed on any, every process stops,
        naming the ranks that failed and their errors (``doing``: "starting", what they were doing). Without it a
        rank failing alone left the others going on to their next collective, where torchrun ends them with a
        "connection closed" traceback and a launch by hand (srun, mpirun) waits for hours (COLLECTIVE_TIMEOUT). A
        failed rank raises its own error again where it is not a SanlabError (its traceback: torchrun's root
        cause); otherwise every rank raises the same TrainingError, or a ``RelayedCrash`` where another rank
        crashed."""
        if not self.enabled:
            yield
            return
        own: Exception | None = None
        try:
            yield
        except Exception as err:
            own = err
        reports = self.gather(None if own is None else failure_report(own))
        failed = [(rank, report) for rank, report in enumerate(reports) if report is not None]
        if not failed:
            return
        if own is not None and not isinstance(own, SanlabError):
            raise own
        # ranks with the same error (every node missing the same file) are named together
        by_message: dict[str, list[int]] = {}
        for rank, report in failed:
            by_message.setdefault(_described(report), []).append(rank)
        said = "; ".join(f"{_ranks(ranks)} stopped while {doing}: {message}" for message, ranks in by_message.items())
        if own is None and any(not report["sanlab"] for _, report in failed):
            raise RelayedCrash(said)
        raise TrainingError(said) from own  # (a rank with a sanlab error of its own says it, crashes or not)


class RelayedError(TrainingError):
    """Another process's sanlab error (a user's mistake), which this process stops with. Under ``sanlab train
    --nproc`` the process that found it tells the launcher in its own words; this one adds nothing (two messages
    for one mistake, and which one the launcher printed was a race)."""


class RelayedCrash(TrainingError):
    """Another process failed with an error that is not a SanlabError (a bug, the machine's OSError), and this one
    stops with it. Not a user's mistake: under ``sanlab train --nproc`` the CLI leaves it to the launcher, which
    names the crashed process and its error from torchrun's account (``training/worker_failure.py``; the traceback in
    the run's launch.log), instead of handing it over as a sanlab error; a process started by hand prints it as a
    message."""


def failure_report(err: Exception) -> dict:
    """What a failed process tells the others: its message, and whether it is a SanlabError (a user's mistake, said
    in its own words; anything else is a crash, relayed as a ``RelayedCrash`` with its type)."""
    crash = not isinstance(err, SanlabError) or isinstance(err, RelayedCrash)
    return {"sanlab": not crash, "message": str(err), "type": type(err).__name__}


def _described(report: dict) -> str:
    return report["message"] if report["sanlab"] else f"{report['type']}: {report['message']}"


def _ranks(ranks: list[int]) -> str:
    return f"process {ranks[0]}" if len(ranks) == 1 else f"processes {', '.join(map(str, ranks))}"


def relayed(report: dict, prefix: str) -> SanlabError:
    """The error a process raises for another's ``failure_report``: a SanlabError's own message as it is, any
    other error as a ``RelayedCrash`` "PREFIX: TYPE: MESSAGE"."""
    if report["sanlab"]:
        return RelayedError(report["message"])
    return RelayedCrash(f"{prefix}: {report['type']}: {report['message']}")


@contextlib.contextmanager
def from_environment(device: torch.device = torch.device("cpu"),
                     rendezvous_timeout: timedelta = RENDEZVOUS_TIMEOUT) -> Iterator[Distributed]:
    """The process group torchrun describes in the environment (``RANK``, ``WORLD_SIZE``, ``MASTER_*``),
    set up for the block and torn down after it; a single process without those variables. ``device`` is this
    process's (``training.device.resolve_device``): NCCL for CUDA, gloo for the CPU. Processes started by hand
    with those variables must all meet within ``rendezvous_timeout``."""
    world_size, rank = _world_and_rank()
    if world_size <= 1:
        yield Distributed(device=device)
        return
    owns_group = not dist.is_initialized()
    if owns_group:
        _release_retired_groups()
        if device.type == "cuda":
            torch.cuda.set_device(device)  # the object collectives (broadcast, gather) use the current device
        backend = "nccl" if device.type == "cuda" else "gloo"
        if _launched_by_torchrun():  # its agent holds the store and ends every rank when one fails
            dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
        else:
            dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT, rank=rank, world_size=world_size,
                                    store=_meet(rank, world_size, rendezvous_timeout))
    try:
        yield Distributed(rank=rank, world_size=world_size, device=device)
    finally:
        if owns_group:
            _tear_down()


# what torchrun sets in every process it starts; a launch by hand (srun, mpirun, a shell per rank) must set them too
TORCHRUN_VARIABLES = "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"


def _world_and_rank() -> tuple[int, int]:
    """WORLD_SIZE and RANK from the environment ((1, 0) without WORLD_SIZE); a SanlabError naming the variables when
    they are not whole numbers, or WORLD_SIZE says several processes and RANK is missing (processes started half-way
    by hand, which would otherwise stop with a bare KeyError: 'RANK')."""
    def number(name: str, value: str) -> int:
        if not re.fullmatch(r"[0-9]+", value.strip()):  # (str.isdigit() takes "²", which int() refuses)
            raise SanlabError(f"{name}={value} in the environment: expected a whole number ({TORCHRUN_VARIABLES} "
                              "describe the processes of a data-parallel run; torchrun sets them)")
        return int(value)

    world_size = number("WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return world_size, 0
    if "RANK" not in os.environ:
        raise SanlabError(f"WORLD_SIZE={world_size} in the environment but no RANK: a process of a data-parallel run "
                          f"needs {TORCHRUN_VARIABLES}, as torchrun sets them (`sanlab train --nproc N` or torchrun "
                          "starts the processes for you; unset WORLD_SIZE for one process)")
    rank = number("RANK", os.environ["RANK"])
    if rank >= world_size:
        raise SanlabError(f"RANK={rank} in the environment but WORLD_SIZE={world_size}: ranks run from 0 to "
                          f"{world_size - 1}")
    return world_size, rank


def _tear_down() -> None:
    """Destroy the default process group, keeping its object in ``_RETIRED_GROUPS`` (why: there)."""
    _RETIRED_GROUPS.append(dist.group.WORLD)
    dist.destroy_process_group()


def _launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ


def _meet(rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """The store at MASTER_ADDR:MASTER_PORT (rank 0 serves it) once every rank has connected, waiting at most
    ``timeout``; a clear error otherwise. Its timeout is then the collectives' (NCCL creates its communicators
    through the store at the first collective, which may come long after this meeting)."""
    host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        raise RuntimeError(f"rank {rank} of {world_size}: MASTER_ADDR and MASTER_PORT must name rank 0's host and a "
                           f"free port (got MASTER_ADDR={host!r}, MASTER_PORT={port!r})")
    try:
        # multi_tenant, as torch's env:// rendezvous: another process group of this process may share the port.
        store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout,
                              wait_for_workers=True, multi_tenant=True)
    except RuntimeError as error:
        if rank == 0:
            problem = f"could not serve the rendezvous on {host}:{port}, or not all {world_size} ranks reached it"
        else:
            problem = f"could not meet rank 0 at {host}:{port}"
        raise RuntimeError(
            f"rank {rank} of {world_size} {problem} within {timeout.total_seconds():g} s: are all ranks started "
            f"with the same MASTER_ADDR and MASTER_PORT, and is that port free on rank 0's host? ({error})") from error
    store.set_timeout(COLLECTIVE_TIMEOUT)
    return store
