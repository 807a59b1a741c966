"""Run a trained model on one sentence and return one layer's attention trace with token labels.

Used by ``sanlab analyze attention``. The task of the run traces its model (``Task.attention_trace``,
``tasks/traces.py``): every layer appends its mixer's trace, see ``layers/transformer.py``.
"""

from __future__ import annotations

from pathlib import Path

from sanlab.errors import ConfigError
from sanlab.tasks.traces import SIDES, LayerTrace, tagging_trace, translation_trace  # noqa: F401  (re-exported)


def layer_trace(run_dir: Path, *, sentence: str, side: str = "encoder", layer: int = 0, target: str | None = None,
                checkpoint: str = "best", device: str = "cpu") -> LayerTrace:
    """Load the run's model on ``device`` (auto, cpu, cuda, cuda:N) and trace ``layer`` on ``side`` for
    ``sentence``; the trace comes back on the CPU."""
    from sanlab.runs import load_trained
    from sanlab.tasks.base import task_for

    if side not in SIDES:
        raise ConfigError(f"unknown side {side!r}; choose one of {SIDES}")
    if not sentence.strip():
        raise ConfigError("the sentence to analyse is empty")
    config, model, assets = load_trained(run_dir, checkpoint=checkpoint, device=device)
    return task_for(config).attention_trace(model, assets, config, sentence=sentence, side=side, layer=layer,
                                            target=target)
