"""The task a config trains (``tasks.base.task_for``) and the check that its model can be built at all."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import torch

from sanlab.config import Config
from sanlab.errors import ConfigError
from sanlab.tasks.base import task_for
from sanlab.training.logging import RunLogger


def make_task(config: Config, run_dir: Path, log: RunLogger, *, main: bool = True):
    """The training side of the task (``training.loop.TrainTask``): reads the data, builds the model. ``main``:
    False in a distributed run's other processes, which read the vocabulary / subword model(s) the main process
    wrote into ``run_dir`` instead of building and writing them (``Task.shared_files``)."""
    task = task_for(config)
    if main or not _takes_main(task.trainer):  # (a task of another package may predate ``main``: nothing shared)
        return task.trainer(config, run_dir, log)
    return task.trainer(config, run_dir, log, main=False)


def _takes_main(trainer) -> bool:
    parameters = inspect.signature(trainer).parameters
    return "main" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def check_buildable(config: Config, *, source: str | None = None) -> None:
    """Build the model on the meta device (no memory, no data, milliseconds) so that an impossible
    combination of settings, e.g. 2D-CSAN with more heads in its area than the layer has, is
    reported before data loading and vocabulary training, as a config error naming ``source`` (the config
    file, or a grid's cell) where the caller knows it."""
    # the model code is imported first, outside the meta device: on torch 2.6 the import of FlexAttention
    # (torch._dynamo) reads tensors it creates, which fails on meta
    importlib.import_module("sanlab.models.builders")

    try:
        with torch.device("meta"):
            task_for(config).check_buildable(config)
    except ValueError as err:
        raise ConfigError(f"{source + ': ' if source else ''}this model cannot be built: {err}") from None
