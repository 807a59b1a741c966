"""Where a run computes and in what precision: the one place that turns ``train.device``,
``train.precision`` and ``train.deterministic`` into torch objects and settings. Parts, layers and models never
branch on the device; the trainer moves the model and each batch here, and runs the forward under
``Precision.autocast``.

    device         auto (CUDA when available, else the CPU) | cpu | cuda | cuda:N; under torchrun, ``cuda``
                   and ``auto`` mean cuda:LOCAL_RANK, one GPU per process (``_rank_on_node``: in a data-parallel
                   run, mpirun's and srun's variables where LOCAL_RANK is unset)
    precision      fp32 | bf16 (autocast, CPU or CUDA) | fp16 (autocast + dynamic loss scaling, CUDA;
                   on the CPU too where torch supports it, for tests)
    deterministic  torch's deterministic algorithms for the run (``deterministic_algorithms``)

Decoding (``--precision`` on ``translate``, ``tag`` and ``evaluate``) takes fp32 or bf16: ``decoding_precision``.
A batch that does not fit the device's memory stops training or decoding with what to try
(``out_of_memory_stops``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from sanlab.errors import ConfigError, DecodingError, SanlabError, TrainingError

DEVICE_SPEC = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# what decoding and tagging run in (--precision): the model's forward under autocast, the search's scores in fp32
DECODE_PRECISIONS = ("fp32", "bf16")
# how torch's CPU allocator and the libraries under torch say they could not allocate (cuBLAS, cuDNN:
# "CUBLAS_STATUS_ALLOC_FAILED"); CUDA's own allocator raises torch.OutOfMemoryError
OUT_OF_MEMORY = re.compile(r"STATUS_ALLOC_FAILED|CUDA error: out of memory|DefaultCPUAllocator: can't allocate memory")
# fairseq's --min-loss-scale default: below it fp16 training has stopped learning, however long it runs
MIN_LOSS_SCALE = 1e-4


# Where a process's rank on its node is: LOCAL_RANK (torchrun's, and what processes started by hand set) counts
# whenever it is set; in a data-parallel run without it, mpirun's (Open MPI) or srun's (Slurm) variable. mpirun's
# first: mpirun inside a Slurm job may start its processes through srun, whose variables they then inherit.
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
# and how many processes share the node, by the same launchers: srun's step layout (SLURM_STEP_TASKS_PER_NODE,
# "2(x3),1") before SLURM_NTASKS_PER_NODE, a request that srun sets only when asked and a batch job passes on
LOCAL_WORLD_SIZE_VARIABLES = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_STEP_TASKS_PER_NODE",
                              "SLURM_NTASKS_PER_NODE")
# one entry of a Slurm tasks-per-node list: a count, and how many nodes in a row have it
SLURM_TASKS = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


def _whole_number(name: str, value: str) -> int:
    # (str.isdigit() takes "²", which int() refuses)
    if not re.fullmatch(r"[0-9]+", value.strip()):
        raise ConfigError(f"{name}={value} in the environment: expected a whole number (the launcher of the "
                          "processes sets it)")
    return int(value)


def _first_set(names: tuple[str, ...]) -> tuple[str, int] | None:
    """The first of ``names`` set in the environment, with its value as a number (a ConfigError naming it if that
    is not a whole number)."""
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip():
            return name, _whole_number(name, value)
    return None


def _data_parallel() -> bool:
    """Whether WORLD_SIZE says several processes (a batch job's Slurm variables alone do not: ``srun -n2 sanlab
    evaluate`` runs two independent processes)."""
    world = _first_set(("WORLD_SIZE",))
    return world is not None and world[1] > 1


def _rank_on_node() -> tuple[str, int] | None:
    """The variable that gives this process's index on its node, and its value (``LOCAL_RANK_VARIABLES``): None
    where none counts."""
    if _data_parallel():
        return _first_set(LOCAL_RANK_VARIABLES)
    return _first_set(LOCAL_RANK_VARIABLES[:1])


def _slurm_tasks_per_node(name: str, value: str) -> tuple[int, bool]:
    """The most tasks a Slurm tasks-per-node list (``"2(x3),1"``) puts on one node, and whether every node has
    that many (then it is this node's count too)."""
    counts = set()
    for part in value.split(","):
        found = SLURM_TASKS.fullmatch(part.strip())
        if found is None:
            raise ConfigError(f"{name}={value} in the environment: expected Slurm's tasks per node, counts with "
                              "repeats such as 2(x3),1 (srun sets it)")
        counts.add(int(found[1]))
    return max(counts), len(counts) == 1


def _processes_on_node() -> tuple[str, int, bool] | None:
    """The variable that says how many processes run on this node (``LOCAL_WORLD_SIZE_VARIABLES``), the count,
    and whether it is this node's own (False: the most on any node of the job, srun's uneven layouts); None where
    none is set."""
    for name in LOCAL_WORLD_SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if not value.strip():
            continue
        if name == "SLURM_STEP_TASKS_PER_NODE":
            return name, *_slurm_tasks_per_node(name, value)
        return name, _whole_number(name, value), True
    return None


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The ``torch.device`` a ``train.device`` value names on this machine (a clear error if it has none); a
    ``torch.device`` (from Python, as ``.to`` takes one) is checked as its name, ``cuda:0`` or ``cpu``."""
    spec = str(spec) if isinstance(spec, torch.device) else spec
    if not DEVICE_SPEC.match(spec):
        raise ConfigError(f"device {spec!r}: expected auto, cpu, cuda or cuda:N")
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {spec!r}: this torch ({torch.__version__}) sees no CUDA device; use cpu or auto")
    shared = _processes_on_node() if spec != "cuda" and _data_parallel() else None
    if shared is not None and shared[1] > 1:  # (one process per node may pick its GPU)
        name, count, own = shared
        where = "this node" if own else "a node"
        raise ConfigError(f"device {spec!r} with {count} processes on {where} ({name}={os.environ[name]}): every "
                          "one would use that one GPU; use cuda (each process takes cuda:LOCAL_RANK)")
    count = torch.cuda.device_count()
    found = _rank_on_node() if spec == "cuda" else None
    if spec != "cuda":
        index = int(spec.split(":")[1])
    else:
        index = 0 if found is None else found[1]
    if found is not None and found[0] != "LOCAL_RANK" and index >= count == 1:
        # srun --gpus-per-task=1, or a scheduler's CUDA_VISIBLE_DEVICES: each process sees its own GPU alone, as
        # cuda:0 (torchrun's LOCAL_RANK counts the node's GPUs: it keeps its meaning, and its error below)
        index = 0
    if index >= count:
        why = f" (cuda, for the process with {found[0]}={found[1]})" if found else ""
        advice = ("; give each process one GPU (srun --gpus-per-task=1: it takes cuda:0) or start at most "
                  f"{count} processes per node") if found is not None and found[0] != "LOCAL_RANK" else ""
        raise ConfigError(f"device cuda:{index}{why}: this process sees {count} CUDA device(s){advice}")
    return torch.device("cuda", index)


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor on ``device`` (dataclasses, tuples, lists and dicts are walked). A CPU
    tensor for CUDA is pinned first, so the copy does not wait for the host; on the CPU nothing moves. A copy
    back to the host blocks: a non-blocking one could be read before it has landed."""
    if isinstance(batch, Tensor):
        if batch.device == device:
            return batch
        if device.type == "cuda" and batch.device.type == "cpu":
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=device.type == "cuda")
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = {f.name: to_device(getattr(batch, f.name), device) for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **fields)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(x, device) for x in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model`` lives (its first parameter's device; the CPU for a model without parameters): what
    validation and decoding move their batches to."""
    first = next(model.parameters(), None)
    return torch.device("cpu") if first is None else first.device


@contextlib.contextmanager
def evaluation_mode(model: torch.nn.Module):
    """``model`` in eval mode inside (no dropout), and afterwards each of its modules in the mode it had: decoding
    called from a training loop, or on a model whose user froze part of it, leaves it as it was."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


@dataclasses.dataclass(frozen=True)
class Precision:
    """A run's ``train.precision`` on its device: the autocast context and, for fp16, the loss scaler."""

    name: str = "fp32"
    device: torch.device = torch.device("cpu")

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=DTYPES[self.name])

    def cast_cache(self) -> contextlib.AbstractContextManager:
        """Keeps autocast's bf16 copies of the weights across the ``autocast()`` blocks inside it, so a search
        that runs every decoder step under its own ``autocast()`` casts the weights once, not at every step.
        torch drops those copies when the outermost autocast context exits, and a disabled context counts
        as one: inside this one the code between the steps (the beam search's arithmetic) stays fp32."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, enabled=False)

    def scaler(self) -> "torch.amp.GradScaler | None":
        """fp16's dynamic loss scale (None otherwise): a step whose gradients overflow is skipped and the
        scale halved; after 2,000 good steps it doubles."""
        if self.name != "fp16":
            return None
        return torch.amp.GradScaler(self.device.type)


def decoding_precision(name: str, device: torch.device) -> Precision:
    """The ``Precision`` that ``translate``, ``tag`` and ``evaluate`` run a trained model in on ``device``:
    fp32, or bf16 (the model's forward steps under autocast; log-probabilities, beam scores and argmaxes are
    taken in fp32, as training takes its losses)."""
    return Precision(check_decoding_precision(name), torch.device(device))


def check_decoding_precision(name: str) -> str:
    """``name`` if decoding can run in it (``DECODE_PRECISIONS``), else a ConfigError."""
    if name not in DECODE_PRECISIONS:
        raise ConfigError(f"precision {name!r} for decoding: expected one of {', '.join(DECODE_PRECISIONS)}")
    return name


def clipping_advice(clip_norm: float) -> str:
    """What to try with gradient clipping after a divergence: turn it on, or clip harder if it is on already (it
    said "--set train.clip_norm=1.0" to a run clipping at 0.1)."""
    if clip_norm <= 0:
        return "--set train.clip_norm=1.0"
    return f"a smaller train.clip_norm (this run clips at {clip_norm:g})"


def check_loss_scale(scaler: "torch.amp.GradScaler | None", *, step: int, clip_norm: float) -> None:
    """Stop with advice, not a traceback, when fp16's loss scale has collapsed (fairseq's "minimum loss scale
    reached"): every recent update overflowed, so training no longer moves."""
    if scaler is not None and scaler.get_scale() < MIN_LOSS_SCALE:
        raise TrainingError(f"fp16 loss scale fell below {MIN_LOSS_SCALE:g} by update {step}: the gradients overflow "
                            "at every scale. Try train.precision=bf16, a lower train.lr, a longer warm-up, or "
                            f"{clipping_advice(clip_norm)}")


# cuBLAS's settings for reproducible results (NVIDIA's cuBLAS guide, "Results reproducibility"); torch refuses a
# cuBLAS product under deterministic algorithms without one of them
CUBLAS_DETERMINISTIC, CUBLAS_DETERMINISTIC_SMALL = ":4096:8", ":16:8"


def check_cublas_setting() -> None:
    """A ConfigError if the environment sets ``CUBLAS_WORKSPACE_CONFIG`` to a value cuBLAS does not reproduce with
    (``train.deterministic`` on CUDA; asked before a run directory is touched)."""
    given = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if given is not None and given not in (CUBLAS_DETERMINISTIC, CUBLAS_DETERMINISTIC_SMALL):
        raise ConfigError(f"CUBLAS_WORKSPACE_CONFIG={given} in the environment: train.deterministic needs "
                          f"{CUBLAS_DETERMINISTIC} or {CUBLAS_DETERMINISTIC_SMALL} (cuBLAS's reproducible settings), "
                          "or the variable unset")


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool, device: torch.device):
    """``train.deterministic``: inside, torch runs only deterministic algorithms, and an operator that has none
    raises (``torch.use_deterministic_algorithms``), so that on a GPU two runs of a config, or a run and its resumed
    twin, agree bit for bit. By default several CUDA kernels add in an order that varies from call to call (atomic
    additions: scatter_add, index_add, the backward of gather and index_select, SDPA's backward), so those runs
    drift apart from the first update on. cuDNN is held to its deterministic algorithms too, without
    benchmarking, and cuBLAS gets its reproducible workspace setting (``CUBLAS_WORKSPACE_CONFIG``, for the
    process, unless set already; a value cuBLAS cannot reproduce with is a ConfigError). The CPU's kernels are
    deterministic already; there it changes which path a few layers take, up to rounding (capsule routing's
    prefix sums, ``attention/routing.py``; FlexAttention's choice, ``attention/plans.choose``). Everything but
    the cuBLAS variable is restored on exit (a process may train more than once); that one stays, since cuBLAS
    reads it once per process and unsetting it afterwards would change nothing but what the environment says.

    Yields a warning to log, or None: torch reads the cuBLAS setting once, when the process first uses cuBLAS,
    so set here after CUDA work began (a test session, a grid that trained another cell in this process) it may
    not hold."""
    if not enabled:
        yield None
        return
    warning = None
    if device.type == "cuda":
        check_cublas_setting()
        given = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        if given is None and torch.cuda.is_initialized():
            warning = (f"CUDA was in use in this process before train.deterministic set CUBLAS_WORKSPACE_CONFIG="
                       f"{CUBLAS_DETERMINISTIC}, and cuBLAS may keep the workspace it chose then: for a bit-exact "
                       "run export the variable before starting")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield warning
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]


@contextlib.contextmanager
def out_of_memory_stops(device: torch.device, *, where: str | Callable[[], str], advice: str | Callable[[], str],
                        error: type[SanlabError] = TrainingError):
    """Device memory running out inside (``torch.OutOfMemoryError``, CUDA's) as an ``error`` that says ``where``,
    torch's account of the memory (its first line: what was asked for, the device's capacity, what is free, what
    this process holds), this process's peak, and ``advice``: not a traceback from deep in a layer. ``where`` and
    ``advice`` may be functions, called only then (a training update says its batch in words only when it fails)."""
    def said(text: str | Callable[[], str]) -> str:
        return text() if callable(text) else text

    try:
        yield
    except DecodingError as err:  # a search inside ran out (validation's): said here, with this caller's advice
        if err.account is None or error is DecodingError:
            raise
        raise error(f"{said(where)} ran out of memory on {device} ({err.where}): {err.account} "
                    f"{said(advice)}") from None
    except RuntimeError as err:  # torch's OutOfMemoryError, the CPU's allocator, cuBLAS/cuDNN's workspaces
        if not (isinstance(err, torch.cuda.OutOfMemoryError) or OUT_OF_MEMORY.search(str(err))):
            raise
        told = str(err).strip().splitlines()[0] if str(err).strip() else "out of memory"
        if device.type == "cuda":
            told += f" This process's peak: {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB allocated."
        message = f"{said(where)} ran out of memory on {device}: {told} {said(advice)}"
        raise (error(message, where=said(where), account=told) if error is DecodingError else error(message)) from None


def describe_batch(batch: Any) -> str:
    """A batch in words for a message about it: its own ``describe()`` where it has one (the tasks' batches), else
    its arrays by shape and its integers (``"src 64x37, tgt_in 64x40, tokens 1,812"``, a dataclass's fields), else
    the name of its type."""
    if callable(getattr(batch, "describe", None)):
        return batch.describe()
    if not dataclasses.is_dataclass(batch) or isinstance(batch, type):
        return type(batch).__name__
    said = []
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, int) and not isinstance(value, bool):
            said.append(f"{f.name} {value:,}")
        elif hasattr(value, "shape") and hasattr(value, "dtype"):  # a tensor or a numpy array
            said.append(f"{f.name} {'x'.join(map(str, value.shape))}")
    return ", ".join(said) or type(batch).__name__


def cpu_model() -> str:
    """The CPU's model name, for a report of timings (``platform.machine()`` says only x86_64: not which CPU)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device | None = None) -> dict[str, Any]:
    """What a result's numbers depend on beyond the config: torch and its CUDA, cuDNN and NCCL, and the device
    (``sanlab env``, and the first line of every ``train.log``)."""
    cuda = torch.cuda.is_available()
    found: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": cuda,
                             "cudnn": torch.backends.cudnn.version() if cuda else None,
                             "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
                             "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                             if cuda else [], "cpu_threads": torch.get_num_threads()}
    if device is not None:
        found["device"] = str(device)
        if device.type == "cuda":
            found["device_name"] = torch.cuda.get_device_name(device)
    return found


def describe_environment(device: torch.device, *, precision: str, processes: int, compiled: str | None = None,
                         deterministic: bool = False) -> str:
    """One line of ``environment`` for a run's log (``compiled``: the torch.compile backend, None for eager)."""
    env = environment(device)
    name = f" ({env['device_name']})" if "device_name" in env else ""
    cuda = f", CUDA {env['cuda']}, cuDNN {env['cudnn']}, NCCL {env['nccl']}" if env["cuda_available"] else ""
    return (f"device {env['device']}{name}, precision {precision}, torch {env['torch']}{cuda}, "
            f"{processes} process(es), {env['cpu_threads']} CPU thread(s) each, "
            + (f"compiled ({compiled})" if compiled else "eager")
            + (", deterministic algorithms" if deterministic else ""))
