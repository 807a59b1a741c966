"""The config of a whole run, one class per task (``TaskConfig``: ``TranslationConfig``, ``TaggingConfig``), its
sections put together with the rules that span them (a train key only the other task reads, data that must
fit the model); and ``TASKS``, the registry of the tasks a config may name (sanlab's and installed packages').
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import model_validator

from sanlab.config.data import TaggingDataConfig, TranslationDataConfig
from sanlab.config.decode import DecodeConfig
from sanlab.config.fields import Strict
from sanlab.config.model import Seq2SeqConfig, TaggerConfig
from sanlab.config.train import IGNORED_TRAIN_KEYS, TaggerTrainConfig, TrainConfig
from sanlab.errors import case_hint
from sanlab.registry import TaskRegistry


class TaskConfig(Strict):
    """Base of the config of a run: ``task`` is the name its task is registered under (``TASKS``), and
    ``implementation`` the ``"module:Class"`` of its ``sanlab.tasks.Task``. Every task config has ``data`` and
    ``train`` (a ``TrainConfig``); ``model`` and ``decode`` as the task needs."""

    task: str
    implementation: ClassVar[str]
    # the metrics of the task's validation that train.best_metric may name, each with whether higher is better;
    # the task's own (``Task.metric``) among them. Empty: train.best_metric must stay unset
    best_metrics: ClassVar[dict[str, bool]] = {}

    @model_validator(mode="after")
    def _best_metric_is_one_validation_gives(self) -> "TaskConfig":
        chosen = getattr(getattr(self, "train", None), "best_metric", None)
        if chosen is None or chosen in self.best_metrics:
            return self
        if not self.best_metrics:
            raise ValueError(f"train.best_metric is {chosen!r}, but the {self.task} task names no metric to choose "
                             "from: leave it out (its own metric picks the best checkpoints)")
        *rest, last = self.best_metrics
        advice = case_hint(chosen, self.best_metrics) or "choose one of them, or leave it out for the task's own"
        raise ValueError(f"train.best_metric is {chosen!r}, but a {self.task} run's validation gives "
                         f"{', '.join(rest)}{' or ' if rest else ''}{last}: {advice}")


def _keys_of_another_task(train: TrainConfig, *, task: str, other: str) -> None:
    for key in IGNORED_TRAIN_KEYS[task]:
        value, default = getattr(train, key), type(train).model_fields[key].default
        if value != default:
            raise ValueError(f"train.{key} is {value}, but a {task} run does not read it ({other} does): remove "
                             f"it, or leave it at its default ({default})")


class TranslationConfig(TaskConfig):
    task: Literal["translation"]
    implementation = "sanlab.tasks.translation_task:Translation"
    best_metrics = {"bleu": True, "loss": False, "ppl": False}  # (the task's own: bleu)
    data: TranslationDataConfig
    model: Seq2SeqConfig = Seq2SeqConfig()
    train: TrainConfig = TrainConfig()
    decode: DecodeConfig = DecodeConfig()

    @model_validator(mode="after")
    def _no_tagging_keys(self) -> "TranslationConfig":
        _keys_of_another_task(self.train, task="translation", other="tagging")
        return self

    @model_validator(mode="after")
    def _bleu_needs_a_decode(self) -> "TranslationConfig":
        if self.train.valid_max_sentences == 0 and self.train.best_metric in (None, "bleu"):  # (None: bleu)
            raise ValueError("train.valid_max_sentences is 0 (validation decodes no sentence: no BLEU), but BLEU "
                             "picks the best checkpoints: set train.best_metric to loss or ppl, or decode some "
                             "sentences")
        return self

    @model_validator(mode="after")
    def _training_pairs_fit_the_model(self) -> "TranslationConfig":
        if self.data.max_len + 1 > self.model.max_positions:  # + EOS (source) / BOS (target input)
            raise ValueError(f"data.max_len {self.data.max_len} (+1 for the end/start token) exceeds "
                             f"model.max_positions {self.model.max_positions}: lower one or raise the other")
        # (rounding a batch up to train.pad_multiple stops at model.max_positions: TranslationTask.read)
        return self

    @model_validator(mode="after")
    def _one_table_needs_one_vocabulary(self) -> "TranslationConfig":
        if not self.data.subword.joint and self.model.share_embeddings:
            raise ValueError("model.share_embeddings needs data.subword.joint: true (one vocabulary for both "
                             "sides); for separate source and target vocabularies set model.share_embeddings: false")
        return self


class TaggingConfig(TaskConfig):
    task: Literal["tagging"]
    implementation = "sanlab.tasks.tagging_task:Tagging"
    best_metrics = {"accuracy": True, "loss": False}  # (the task's own: accuracy)
    data: TaggingDataConfig
    model: TaggerConfig = TaggerConfig()
    train: TaggerTrainConfig = TaggerTrainConfig()

    @model_validator(mode="after")
    def _no_translation_keys(self) -> "TaggingConfig":
        _keys_of_another_task(self.train, task="tagging", other="translation")
        return self


# The tasks a config may name: sanlab's, and those of installed packages (entry point group ``sanlab.tasks``).
TASKS = TaskRegistry("task", group="sanlab.tasks", builtin={"translation": "sanlab.config:TranslationConfig",
                                                          "tagging": "sanlab.config:TaggingConfig"})


Config = TaskConfig  # the config of a run, whatever its task
