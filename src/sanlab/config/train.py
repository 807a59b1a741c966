"""The ``train:`` section (``TrainConfig``; the tagger's defaults, ``TaggerTrainConfig``) and which of its keys a
run reads: a key that the other settings leave unread (``unread_train_keys``) or that only the other task reads
(``IGNORED_TRAIN_KEYS``) is refused in a new config, and dropped from a run directory's config written before
the rule (``without_ignored_train_keys``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sanlab.config.fields import Fraction, NonNegative, NonNegativeFloat, Positive, Strict


class TrainConfig(Strict):
    # numpy's generators (the translation batch order) refuse a negative seed; torch.manual_seed one past
    # 2^64 - 1, and a data-parallel rank seeds seed * 1_000_003 + rank: 32 bits keep all of them in range
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 1
    optimizer: Literal["adam", "rmsprop"] = "adam"
    lr: NonNegativeFloat = 7e-4
    betas: tuple[Fraction, Fraction] = (0.9, 0.98)
    eps: Annotated[float, Field(gt=0)] = 1e-9
    rmsprop_alpha: Fraction = 0.9
    weight_decay: NonNegativeFloat = 0.0
    schedule: Literal["inverse_sqrt", "constant"] = "inverse_sqrt"
    warmup_steps: NonNegative = 4000
    warmup_init_lr: NonNegativeFloat = 1e-7
    label_smoothing: Fraction = 0.1
    max_tokens: Positive = 4096  # translation: padded tokens per batch (max over both sides)
    batch_size: Positive = 32   # tagging: sentences (chunks) per batch
    accum_steps: Positive = 1
    clip_norm: NonNegativeFloat = 0.0  # 0 = no clipping
    # auto | cpu | cuda | cuda:N (training/device.py); precision: fp32 | bf16 | fp16 (fp16 with loss scaling)
    device: Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?)$")] = "auto"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    # deterministic algorithms only (training/device.py, ``deterministic_algorithms``): on a GPU, where several
    # kernels add in a varying order by default, two runs (or a run and its resumed twin) then agree bit for bit
    deterministic: bool = False
    # the training forward under torch.compile (training/compile.py): recompiles are reported, and hitting
    # the recompile limit stops the run instead of falling back to eager; compile_backend: inductor (the
    # fast one), aot_eager or eager (debugging); pad_multiple: batch lengths rounded up to a multiple of
    # it (tensor-core friendly, fewer distinct shapes), default 8 under compile and 1 (no padding) without,
    # never past the model's positions (model.max_positions; the tagger's model.max_len)
    compile: bool = False
    compile_backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    compile_dynamic: bool | None = None  # None: torch's automatic dynamic shapes; false: one static graph per shape
    pad_multiple: Positive | None = None
    max_steps: NonNegative = 100_000  # 0 saves the initial weights (validated)
    max_epochs: NonNegative = 100
    valid_every: NonNegative = 1000  # steps; 0 = after every epoch
    # decode only this many valid sentences for BLEU (None = all; 0 = none: the loss alone, as fairseq validates)
    valid_max_sentences: NonNegative | None = None
    # the validation metric that picks the `best` checkpoints (keep_best, --checkpoint best) and that patience
    # counts, as fairseq's --best-checkpoint-metric; None: the task's own (translation bleu, tagging accuracy).
    # The names a task's validation gives, each with its direction, are its config class's ``best_metrics``
    best_metric: str | None = None
    patience: NonNegative = 0   # validations without improvement before stopping; 0 = never
    keep_best: int = Field(3, ge=1)
    keep_last: int = Field(3, ge=1)
    log_every: int = Field(50, ge=1)
    threads: Positive | None = None
    progress: bool = True
    # torchrun/DDP only: set when some parameter gets no gradient in an update (DDP then reports which).
    find_unused_parameters: bool = False

    @property
    def length_multiple(self) -> int:
        """What training batches' lengths are rounded up to (``pad_multiple``, resolved)."""
        return self.pad_multiple or (8 if self.compile else 1)

    @model_validator(mode="after")
    def _no_unread_keys(self) -> "TrainConfig":
        for key, why in unread_train_keys(self):
            value, default = getattr(self, key), type(self).model_fields[key].default
            if value != default:
                raise ValueError(f"train.{key} is {value}, but {why}: remove it, or leave it at its default "
                                 f"({default})")
        return self


def unread_train_keys(train: TrainConfig) -> list[tuple[str, str]]:
    """(key, why) of the train keys that ``train``'s other settings leave unread: one optimizer's settings under
    the other, the warm-up's start without a warm-up, the compiler's options without ``compile``. Set to
    anything but their default, a new config is refused, as a value that would silently do nothing."""
    rules = (("betas", train.optimizer != "adam", f"train.optimizer is {train.optimizer}, and only adam reads it"),
             ("rmsprop_alpha", train.optimizer != "rmsprop",
              f"train.optimizer is {train.optimizer}, and only rmsprop reads it"),
             # update n runs at the schedule's rate at n (1-based): with a 1-update warm-up the first is at lr already
             ("warmup_init_lr", train.warmup_steps <= 1, f"train.warmup_steps is {train.warmup_steps} ("
              + ("no warm-up to start it" if train.warmup_steps == 0 else
                 "the first update already runs at train.lr: no warm-up to start") + ")"),
             ("compile_backend", not train.compile, "train.compile is false"),
             ("compile_dynamic", not train.compile, "train.compile is false"))
    return [(key, why) for key, unread, why in rules if unread]


# train keys that only the other task reads: set to anything but the default, a new config is refused; a run
# directory's config.yaml (written before the rule) loads with them dropped, since its run ignored them
IGNORED_TRAIN_KEYS = {"translation": ("batch_size",), "tagging": ("max_tokens", "valid_max_sentences")}


def without_ignored_train_keys(raw: dict) -> dict:
    """``raw`` (a run's own config) without the train keys its run never read: those of the other task
    (``IGNORED_TRAIN_KEYS``) and those its other settings leave unread (``unread_train_keys``)."""
    train, ignored = raw.get("train"), IGNORED_TRAIN_KEYS.get(raw.get("task"), ())
    if not isinstance(train, dict):
        return raw
    kind = TaggerTrainConfig if raw.get("task") == "tagging" else TrainConfig
    try:  # (unvalidated: what the settings say; a bad value is validation's to report)
        unread = [key for key, _ in unread_train_keys(kind.model_construct(**train))]
    except (TypeError, ValueError, AttributeError):
        unread = []
    dropped = (*ignored, *unread)
    if not any(k in train for k in dropped):
        return raw
    return {**raw, "train": {k: v for k, v in train.items() if k not in dropped}}


class TaggerTrainConfig(TrainConfig):
    """Dufter et al.'s training (spec C.10): RMSprop 1e-3 (Keras defaults), batch 32, early stopping on
    dev accuracy after every epoch with patience 3."""

    optimizer: Literal["adam", "rmsprop"] = "rmsprop"
    lr: NonNegativeFloat = 1e-3
    eps: Annotated[float, Field(gt=0)] = 1e-7
    schedule: Literal["inverse_sqrt", "constant"] = "constant"
    warmup_steps: NonNegative = 0
    label_smoothing: Fraction = 0.0
    patience: NonNegative = 3
    valid_every: NonNegative = 0
