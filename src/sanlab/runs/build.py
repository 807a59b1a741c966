"""The task a config trains (translation or tagging) and the check that its model can be built at all."""

from __future__ import annotations

from pathlib import Path

import torch

from sanlab.config import Config, TranslationConfig
from sanlab.errors import ConfigError
from sanlab.training.logging import RunLogger


def task_class(config: Config) -> type:
    """The task that trains ``config`` (its class: ``metric`` and ``higher_is_better`` without building it)."""
    if isinstance(config, TranslationConfig):
        from sanlab.tasks.translation import TranslationTask

        return TranslationTask
    from sanlab.tasks.tagging import TaggingTask

    return TaggingTask


def make_task(config: Config, run_dir: Path, log: RunLogger):
    return task_class(config)(config, run_dir, log)


def check_buildable(config: Config) -> None:
    """Build the model on the meta device (no memory, no data, milliseconds) so that an impossible
    combination of settings, e.g. 2D-CSAN with more heads in its area than the layer has, is
    reported before data loading and vocabulary training, as a config error."""
    from sanlab.models.builders import build_seq2seq, build_tagger

    try:
        with torch.device("meta"):
            if isinstance(config, TranslationConfig):
                build_seq2seq(config.model, vocab_size=16, pad_id=0)
            else:
                build_tagger(config.model, vocab_size=16, num_chars=16, num_tags=4)
    except ValueError as err:
        raise ConfigError(f"this model cannot be built: {err}") from None
