"""``train.compile``: the training forward under ``torch.compile``, its recompiles reported, never a silent
fall-back to eager.

Shapes: batches are padded to a multiple of ``train.pad_multiple`` (8 by default under compile; never past
the model's positions; exact, since padding is masked), and torch's automatic dynamic shapes turn a dimension symbolic the first time
it changes, so a run compiles a handful of graphs, not one per batch shape. Every new graph is logged with
the shapes that caused it; if torch's recompile limit is hit, the run stops with a message instead of
quietly running eager (torch's default), whose speed would then be reported as the compiled model's.
Validation, decoding and checkpoints use the eager module: compiling changes how the forward runs, not
the weights (``tests/training/test_compile.py``: compiled == eager in losses and weights).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import nn

from sanlab.compile_limits import FAIL_SETTINGS, LIMIT_SETTINGS, RECOMPILE_LIMIT, dynamo_settings, raised_limit
from sanlab.errors import TrainingError

LIMIT_ERRORS = ("FailOnRecompileLimitHit", "FailOnCacheLimitHit")


def configure_dynamo() -> bool:
    """Raise the recompile limit and make hitting it an error. Returns False where this torch has no setting
    to stop at the limit (the log then says that a run past it would run eager)."""
    import torch._dynamo

    for name, value in raised_limit().items():
        setattr(torch._dynamo.config, name, value)
    known = dynamo_settings()
    for name in FAIL_SETTINGS:
        if name in known:
            setattr(torch._dynamo.config, name, True)
            return True
    return False


@contextlib.contextmanager
def dynamo_settings_restored(enabled: bool):
    """With ``enabled`` (``train.compile``), the dynamo settings ``configure_dynamo`` changes for a run are given
    back their values once it is done: a later ``torch.compile`` of the caller's own (a notebook, a script that
    trained first) runs eager past torch's own limit, as without sanlab, instead of failing at the run's."""
    if not enabled:  # (dynamo is not even imported)
        yield
        return
    known = dynamo_settings()
    before = {name: known[name] for name in (*LIMIT_SETTINGS, *FAIL_SETTINGS) if name in known}
    try:
        yield
    finally:
        import torch._dynamo

        for name, value in before.items():
            setattr(torch._dynamo.config, name, value)


def compile_model(model: nn.Module, *, backend: str, dynamic: bool | None = None) -> nn.Module:
    """``model`` (the module training runs forward through, DDP-wrapped or not) under ``torch.compile``;
    ``dynamic`` as torch takes it (None: static first, symbolic once a dimension changes)."""
    return torch.compile(model, backend=backend, dynamic=dynamic)


def compiled_graphs() -> int:
    """How many graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def describe_shapes(batch: Any) -> str:
    """What a batch holds, for the log: tensor shapes ("src 32x24, tgt_in 32x16") and the sizes of the other
    fields (a batch not read yet holds example indices and a token count)."""
    if isinstance(batch, torch.Tensor):
        return "x".join(map(str, batch.shape))
    shown = []
    for name in getattr(batch, "__dataclass_fields__", {}):
        value = getattr(batch, name)
        if isinstance(value, torch.Tensor):
            shown.append(f"{name} {describe_shapes(value)}")
        elif isinstance(value, int):
            shown.append(f"{name} {value}")
        elif hasattr(value, "__len__"):
            shown.append(f"{name} {len(value)}")
    return ", ".join(shown) or type(batch).__name__


class GraphWatch:
    """Reports each new graph (the first compile and every recompile) with the batch shapes that caused it,
    and turns torch's "recompile limit reached" into a ``TrainingError`` that says what to do."""

    def __init__(self, log: Callable[[str], None]):
        self.log, self.seen, self.graphs = log, compiled_graphs(), 0  # dynamo's counter is per process

    def call(self, fn: Callable[[], Any], *, step: int, batch: Any) -> Any:
        try:
            result = fn()
        except Exception as err:
            if type(err).__name__ in LIMIT_ERRORS or "fail_on_recompile_limit_hit" in str(err):
                raise TrainingError(f"torch.compile reached its recompile limit ({RECOMPILE_LIMIT} graphs) at update "
                                    f"{step} (batch: {describe_shapes(batch)}): the batch shapes vary too much to compile. Raise "
                                    "train.pad_multiple (e.g. 32), or train without --set train.compile=true") from err
            raise
        now = compiled_graphs()
        if now != self.seen:
            what = "compiled" if self.graphs == 0 else "recompiled"
            self.graphs += now - self.seen
            self.log(f"torch.compile: {what} at update {step} (batch: {describe_shapes(batch)}; {self.graphs} "
                     "graph(s) so far)")
            self.seen = now
        return result
