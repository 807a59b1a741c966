"""Scalars a module reports about its own parameters, logged at every validation.

Some parts carry a few parameters whose trajectory is the question (learnable temperatures that may run
away, gates that may saturate). Such a module implements ``diagnostics() -> {name: float}``; the trainer
collects every one in the model at each validation and logs them as the ``diagnostics`` records of
``metrics.jsonl`` (and TensorBoard), keyed by the module's path in the model. Plot them with
``sanlab analyze curves RUN --split diagnostics --metric 'PATTERN'``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import nn


@runtime_checkable
class ReportsDiagnostics(Protocol):
    def diagnostics(self) -> dict[str, float]: ...


def collect_diagnostics(model: nn.Module) -> dict[str, float]:
    """``{"<module path>/<name>": value}`` over every module of ``model`` that reports diagnostics."""
    found = {}
    for path, module in model.named_modules():
        if isinstance(module, ReportsDiagnostics):
            found.update({f"{path}/{name}": float(value) for name, value in module.diagnostics().items()})
    return found
