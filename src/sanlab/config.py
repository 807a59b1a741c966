"""The typed schema of every run (pydantic v2), the registry of tasks, and the validation of a raw config
(``load_config``: a file with its ``base:`` chain and ``--set a.b=c`` overrides). Unknown or ill-typed keys
are errors naming the key and file.

A config file may start with ``base: other.yaml`` (relative to the file) or
``base: preset:NAME`` (a file in ``sanlab/presets``); its keys are merged over the base. The YAML side of
that (reading, ``base:`` chains, dotted assignments) is ``sanlab.config_yaml``, whose names are re-exported
here.
"""

from __future__ import annotations

import json
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ClassVar, Literal, Union, get_args, get_origin

import yaml
from pydantic import (BaseModel, Field, FieldSerializationInfo, TypeAdapter, ValidationError, field_serializer,
                      model_validator)

from sanlab.attention.config import AttentionConfig
from sanlab.config_yaml import (  # noqa: F401  (re-exported: sanlab.config is where callers find them)
    PRESETS,
    apply_override,
    assigned_keys,
    dump_yaml,
    format_value,
    key_line,
    key_origin,
    load_chain,
    load_raw,
    merge_chain,
    merge_mapping,
    parse_value,
    read_yaml_mapping,
    set_key,
    sets_key,
    unsupported_values,
)
from sanlab.errors import ConfigError
from sanlab.layers.mixers import AttentionMixerConfig, MixerSpec
from sanlab.layers.pre_blocks import PreBlockSpec
from sanlab.registry import STRICT_SCHEMA, TaskRegistry, did_you_mean, error_paths

# Bounds shared by many keys: a value outside them is a config error naming the key, not a traceback from
# deep inside data preparation (or, worse, a silent meaning such as "all" or "never").
Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, lt=1)]  # dropout, smoothing, decay rates


class Strict(BaseModel):
    model_config = STRICT_SCHEMA


# The serialization context of a config written to be read again (``dump_config``): keys a section inherits
# (``StackConfig.INHERITS``) are left out, where every other dump (``model_dump()``, what resumes compare) holds
# the values the run uses.
WRITTEN = "written"


def inherited_keys(section: BaseModel, *, own: frozenset[str]) -> list[str]:
    """The keys of ``section`` that it takes from its source: those it does not set, but its ``own``."""
    return [key for key in type(section).model_fields if key not in section.model_fields_set and key not in own]


def inherit_unset(section: BaseModel, source: BaseModel, *, own: frozenset[str]) -> BaseModel:
    """``section`` with every key it does not set but its ``own`` taken from ``source``; those keys stay unset
    (``model_fields_set`` is the section's own), which is how a written config tells them from the ones set."""
    values = {**section.__dict__, **{key: getattr(source, key) for key in inherited_keys(section, own=own)}}
    return type(section).model_construct(_fields_set=set(section.model_fields_set), **values)


# ----------------------------------------------------------------------------- model
class StackConfig(Strict):
    """One encoder or decoder stack."""

    layers: int = Field(6, ge=1)
    ffn_dim: int = Field(2048, ge=0)   # 0 = no feed-forward sublayer (Dufter's SAN)
    attention: AttentionConfig = AttentionConfig()
    mixer: MixerSpec = AttentionMixerConfig()
    cross_attention: AttentionConfig | None = None  # decoder only; None = ``attention`` without its parts
    pre_blocks: list[PreBlockSpec] = []  # encoder only: sublayers before the mixer (QANet convs), by ``layers``

    # A section that takes each key it does not set from another section: {section: (source, keys of its own)}.
    # The keys it inherits stay unset (``model_fields_set``), and a written config leaves them out
    # (``WRITTEN``), so that they follow the source when the file is read again, as in the file it came from.
    INHERITS: ClassVar[dict[str, tuple[str, frozenset[str]]]] = {
        # ``cross_attention: {parts: [...]}`` must not fall back to AttentionConfig's defaults (8 heads, no dropout)
        # behind the stack's back; its parts and plan are its own (a plan chosen for the self-attention's parts,
        # e.g. banded, may not suit these)
        "cross_attention": ("attention", frozenset({"parts", "plan"})),
    }

    @model_validator(mode="after")
    def _sections_inherit_unset_keys(self) -> "StackConfig":
        for name, (source, own) in self.INHERITS.items():
            section = getattr(self, name)
            if section is not None:
                # through __dict__: assigning the field would validate the model again, and with it this validator
                self.__dict__[name] = inherit_unset(section, getattr(self, source), own=own)
        return self

    @field_serializer(*INHERITS, mode="wrap")
    def _written_without_inherited_keys(self, section: BaseModel | None, handler, info: FieldSerializationInfo):
        out = handler(section)
        if section is not None and isinstance(out, dict) and (info.context or {}).get(WRITTEN):
            for key in inherited_keys(section, own=self.INHERITS[info.field_name][1]):
                out.pop(key, None)
        return out

    @model_validator(mode="after")
    def _layer_indices_exist(self) -> "StackConfig":
        """A part, mixer or pre-block whose ``layers`` name none of the stack's layers would silently do
        nothing. Indices beyond a shallower stack are allowed next to ones it has: defaults such as CSAN's
        "lowest three layers" [0, 1, 2] mean the ones a 1- or 2-layer stack has."""
        placed = [(f"attention.parts[{i}] ({p.type})", p) for i, p in enumerate(self.attention.parts)]
        placed += [(f"cross_attention.parts[{i}] ({p.type})", p)
                   for i, p in enumerate(self.cross_attention.parts if self.cross_attention else [])]
        placed += [(f"mixer ({self.mixer.type})", self.mixer)]
        placed += [(f"pre_blocks[{i}] ({b.type})", b) for i, b in enumerate(self.pre_blocks)]
        for where, item in placed:
            layers = getattr(item, "layers", None)
            if layers is None:
                continue
            if any(i < 0 for i in layers) or not any(i < self.layers for i in layers):
                raise ValueError(f"{where}: layers {layers} name no layer of a stack of {self.layers} layers "
                                 f"(indices 0-{self.layers - 1})")
        return self


class Seq2SeqConfig(Strict):
    dim: Positive = 512
    norm: Literal["pre", "post"] = "post"
    dropout: Fraction = 0.1
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"  # learned: one table per side, max_positions rows
    max_positions: Positive = 1024
    share_embeddings: bool = True   # one table for source and target (needs the joint vocabulary)
    tie_output: bool = True         # generator weight = target embedding
    encoder: StackConfig = StackConfig()
    decoder: StackConfig = StackConfig()


class SanAttentionConfig(AttentionConfig):
    """Dufter et al.'s heads (spec C.1): 4 heads, no projection biases, no output projection."""

    heads: int = Field(4, ge=1)
    bias: bool = False
    out_proj: bool = False


class TaggerStackConfig(StackConfig):
    """The tagger's SAN stack: 4 attention-only layers (subclassed so that setting one key keeps the others)."""

    layers: int = Field(4, ge=1)
    ffn_dim: int = Field(0, ge=0)
    attention: SanAttentionConfig = SanAttentionConfig()


class TaggerConfig(Strict):
    """Dufter et al.'s tagger (spec C.10); UD defaults."""

    word_dim: Positive = 128
    char_dim: Positive = 64
    char_filters: Positive = 64
    char_width: Positive = 5
    char_layers: NonNegative = 3
    max_word_chars: Positive = 20
    position: Literal["add", "concat", "none"] = "add"
    position_dim: Positive = 64         # for concat
    max_len: Positive = 60              # t: sentences are split into chunks of this length
    layer_style: Literal["dufter", "transformer"] = "dufter"
    norm: Literal["pre", "post"] = "pre"  # for layer_style transformer
    dropout: Fraction = 0.1
    mask_padding: bool = True           # the reference code does not mask padding (profile "reproduce")
    train_pad_rows: bool = False        # the reference (Keras) trains the PAD rows of the word and character
                                        # tables (profile "reproduce"); here they stay fixed, as padding
    classifier_sees_embedding: bool = True
    attention_init: Literal["glorot_normal", "torch"] = "glorot_normal"  # Keras glorot_normal per head (C.1, C.10)
    dense_init: Literal["glorot_uniform", "torch"] = "torch"  # char CNN and classifier: Keras' Glorot-uniform
                                        # kernels and zero biases (C.10; profile "reproduce") or PyTorch's
                                        # defaults, with which the clean recipe's grids were trained
    encoder: TaggerStackConfig = TaggerStackConfig()


# ----------------------------------------------------------------------------- data
class SubwordConfig(Strict):
    vocab_size: int = Field(8000, ge=8)
    model_type: Literal["unigram", "bpe"] = "unigram"
    joint: bool = True
    character_coverage: float = Field(1.0, gt=0, le=1)
    # Training sentences (source + target for a joint model) above which sentencepiece trains on this many,
    # sampled, with every core; at or below it on all of them in one thread (bit-identical across runs)
    sample_sentences: int = Field(1_000_000, ge=1)


class ParallelFiles(Strict):
    src: str
    tgt: str


class WeightedFiles(ParallelFiles):
    weight: float = Field(1.0, gt=0)  # share of the sampled training pairs: weight / sum of the weights


class TranslationDataConfig(Strict):
    # one corpus, or several sampled by weight (OpenNMT-py's and Marian's `data` weights): every epoch draws as
    # many pairs as all corpora hold, each from corpus c with probability weight_c / sum of the weights
    train: ParallelFiles | Annotated[list[WeightedFiles], Field(min_length=1)]
    valid: ParallelFiles
    test: dict[str, ParallelFiles] = {}
    subword: SubwordConfig = SubwordConfig()
    max_len: Positive = 200     # subword tokens per side, longer training pairs are dropped
    max_ratio: Annotated[float, Field(ge=1)] | None = None  # longer side / shorter side
    skip_empty: bool = False     # drop train/valid pairs with an empty side instead of failing (test sets: every line)
    filter_valid: bool = False   # max_len and max_ratio drop validation pairs too (the capsule paper's WMT17 setup)

    @property
    def train_corpora(self) -> list[ParallelFiles]:
        """The training corpora, one or several (``train`` in either form)."""
        return list(self.train) if isinstance(self.train, list) else [self.train]


class TaggingDataConfig(Strict):
    train: str
    dev: str
    test: str | None = None
    column: Literal["upos", "xpos"] = "upos"
    vocab_fraction: float = Field(0.5, gt=0, le=1)  # most frequent share of word types (UD: half)
    vocab_max: Positive | None = None               # or a fixed size (PTB: 20,000)
    vocab_from_all_splits: bool = False             # the reference counts train+dev+test


# ----------------------------------------------------------------------------- training
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
    valid_max_sentences: Positive | None = None  # decode only this many valid sentences for BLEU (None = all)
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


def _keys_of_another_task(train: TrainConfig, *, task: str, other: str) -> None:
    for key in IGNORED_TRAIN_KEYS[task]:
        value, default = getattr(train, key), type(train).model_fields[key].default
        if value != default:
            raise ValueError(f"train.{key} is {value}, but a {task} run does not read it ({other} does): remove "
                             f"it, or leave it at its default ({default})")


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


class DecodeConfig(Strict):
    beam: int = Field(5, ge=1)
    length_penalty: float = 1.0
    # how alpha normalises a score of L tokens: L ** alpha (fairseq's --lenpen) or ((5 + L) / 6) ** alpha (GNMT's, as
    # Vaswani et al., THUMT and OpenNMT-py apply it); sanlab.decoding.search.LENGTH_PENALTY_STYLES
    length_penalty_style: Literal["fairseq", "gnmt"] = "fairseq"
    max_len_a: float = Field(1.2, ge=0)   # at most int(a * source length + b) tokens, then EOS (as fairseq; capped at max_positions)
    max_len_b: int = Field(10, ge=0)
    n_best: int = Field(1, ge=1)
    batch_sentences: int = Field(64, ge=1)

    @model_validator(mode="after")
    def _n_best_within_the_beam(self) -> "DecodeConfig":
        if self.n_best > self.beam:
            raise ValueError(f"n_best {self.n_best} is more than the beam of {self.beam} can return")
        return self

    # keys added after records of decode settings were first written (eval-*.json, grid cells' compare-eval.json),
    # with the value those records were decoded with: a record without the key means that value
    ADDED_KEYS: ClassVar[dict[str, str]] = {"length_penalty_style": "fairseq"}

    @classmethod
    def as_recorded(cls, decode: dict) -> dict:
        """``decode`` (a dumped or recorded decode section) without the added keys that hold the value records
        from before them mean, so that a setting equal to an old record compares equal to it."""
        return {k: v for k, v in decode.items() if k not in cls.ADDED_KEYS or v not in (None, cls.ADDED_KEYS[k])}

    def updated(self, **values) -> "DecodeConfig":
        """These settings with ``values`` changed (None values are left out), validated like a config file."""
        try:
            return DecodeConfig.model_validate({**self.model_dump(), **{k: v for k, v in values.items()
                                                                       if v is not None}})
        except ValidationError as err:
            problems = "; ".join("decode" + "".join(f".{part}" for part in e["loc"]) + ": "
                                 + e["msg"].removeprefix("Value error, ") for e in err.errors())
            raise ConfigError(f"invalid decode settings: {problems}") from None


class TaskConfig(Strict):
    """Base of the config of a run: ``task`` is the name its task is registered under (``TASKS``), and
    ``implementation`` the ``"module:Class"`` of its ``sanlab.tasks.Task``. Every task config has ``data`` and
    ``train`` (a ``TrainConfig``); ``model`` and ``decode`` as the task needs."""

    task: str
    implementation: ClassVar[str]


class TranslationConfig(TaskConfig):
    task: Literal["translation"]
    implementation = "sanlab.tasks.translation_task:Translation"
    data: TranslationDataConfig
    model: Seq2SeqConfig = Seq2SeqConfig()
    train: TrainConfig = TrainConfig()
    decode: DecodeConfig = DecodeConfig()

    @model_validator(mode="after")
    def _no_tagging_keys(self) -> "TranslationConfig":
        _keys_of_another_task(self.train, task="translation", other="tagging")
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
_ADAPTERS: dict[tuple, TypeAdapter] = {}


def _adapter() -> TypeAdapter:
    """The schema of a run config: the config class of every registered task, told apart by ``task``."""
    classes = tuple(TASKS.config_classes())
    if classes not in _ADAPTERS:
        union = Union[classes] if len(classes) > 1 else classes[0]
        _ADAPTERS[classes] = TypeAdapter(Annotated[union, Field(discriminator="task")])
    return _ADAPTERS[classes]


def validate(raw: dict, *, source: str, origin: Callable[[str], str | None] | None = None) -> TaskConfig:
    """Validate a raw dict; errors name each offending key and the source (``origin``: where a dotted key was
    set, e.g. "line 4" or "set in base.yaml, line 7", ``load_config``)."""
    if isinstance(raw, dict) and "task" not in raw:  # (pydantic's words: "unable to extract tag using discriminator")
        found = f"its keys: {', '.join(map(str, raw))}" if raw else "it is empty"
        raise ConfigError(f"{source}: no `task:` ({' or '.join(TASKS.references())}), which says what the config "
                          f"trains; {found}")
    raw = _migrated(raw, source=source)

    def line(shown: str, msg: str, key: str, named: list[str] = ()) -> str:
        """One problem, shown at ``shown``; where the first key of ``named`` that has an origin was set, else
        where ``key`` was."""
        where = next((w for k in (*named, key) if k and (w := origin(k))), None) if origin else None
        return f"  {shown or '<root>'}: {msg}" + (f" ({where})" if where else "")

    unsupported = unsupported_values(raw)  # before JSON, which would respell them (a date) or rename them (no: "false")
    if unsupported:
        raise ConfigError(f"{source}: invalid config\n" + "\n".join(line(shown, msg, key)
                                                                   for key, shown, msg in unsupported))
    try:
        # strict, through JSON: a quoted "0.1" or "no" in YAML is a string, refused where a number or a bool
        # belongs (lax mode would convert it); JSON lists still fill tuples, numbers from --set stay typed
        return _adapter().validate_json(json.dumps(raw, default=str), strict=True)
    except ValidationError as err:
        lines = []
        task = raw.get("task") if isinstance(raw, dict) else None  # loc[0]: the task name that picked the schema
        for path, e in error_paths(err, raw, root_tag=task):
            loc = ".".join(map(str, path))
            msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
            if e["type"] == "extra_forbidden":
                msg += did_you_mean(str(path[-1]), _known_keys(raw, path[:-1]))
            if e["type"] == "union_tag_invalid" and not path:  # pydantic's words for an unknown `task:`
                loc, tag = "task", e["ctx"]["tag"]
                msg = f"unknown task {tag!r} (known: {', '.join(TASKS.references())})" + did_you_mean(tag, TASKS.names())
            if e["type"] in ("float_type", "int_type", "bool_type") and _typed_text(e["input"]):
                msg += " (a quoted value is a string in YAML: write it without quotes)"
            empty = e["type"] in ("model_type", "dict_type") and e["input"] is None  # `train:` with nothing under it
            if empty:  # a file's `train:` with nothing under it, or an override's null (--set data.test=null)
                overridden = origin is not None and (origin(loc) or "").startswith("from ")
                msg = ("null where a section belongs: give it keys, or {} to empty it" if overridden else
                       "an empty section (every key under it commented out?): give it keys or {}, or remove the line")
            shown = e["type"] != "extra_forbidden" and not isinstance(e["input"], dict) and not empty
            msg += f" (got {e['input']!r})" if shown else ""
            if e["type"] in ("int_type", "int_from_float") and isinstance(e["input"], float) and e["input"].is_integer():
                msg += (": a number with an exponent or a decimal point (1e5, 100000.0) is a float in YAML; write it as a "
                        f"whole number ({int(e['input'])})")
            if e["type"] == "string_type" and isinstance(e["input"], (bool, int, float)):  # `src: on` is True
                msg += (": YAML reads an unquoted on, off, yes, no, true or false as a boolean"
                        if isinstance(e["input"], bool) else ": YAML reads it as a number") + ": write text in quotes"
            lines.append(line(loc, msg, loc, _named_keys(e, loc, raw)))
        raise ConfigError(f"{source}: invalid config\n" + "\n".join(lines)) from None


def _named_keys(error: dict, loc: str, raw: dict) -> list[str]:
    """The dotted keys under ``loc`` that a rule's message names (``train.betas is ...`` at ``train``, ``data.max_len
    ... exceeds model.max_positions`` at the root): the rule is a section's, and the line to show is theirs."""
    if error["type"] != "value_error":
        return []
    named = re.findall(r"(?<![\w.])[A-Za-z_]\w*(?:\.\w+)+", error["msg"])
    if loc:
        return [k for k in named if k.startswith(loc + ".")]
    return [k for k in named if k.split(".")[0] in raw]


def _known_keys(raw: dict, section: tuple) -> list[str]:
    """The keys the schema of ``raw``'s task takes in the mapping at ``section`` (a key path, ``error_paths``), for
    suggesting one for an unknown key; empty where the schema there is not a model's."""
    try:
        kind = TASKS.entry(raw["task"]).config
    except (ConfigError, KeyError, TypeError):
        return []
    for part in section:
        kind = next((child for branch in _branches(kind) if (child := annotation_at(branch, part)) is not None), None)
    return sorted({name for branch in _branches(kind) if isinstance(branch, type) and issubclass(branch, BaseModel)
                   for name in branch.model_fields})


def _branches(kind: object) -> list:
    """The types a field's annotation allows: itself, or each member of a union, without ``Annotated``."""
    if get_origin(kind) is Annotated:
        return _branches(get_args(kind)[0])
    if get_origin(kind) in (Union, types.UnionType):
        return [b for member in get_args(kind) for b in _branches(member)]
    return [kind]


def annotation_at(kind: object, part: str | int) -> object | None:
    """The annotation of the key or item ``part`` of a value of type ``kind`` (None: it has none)."""
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        field = kind.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field else None
    args = get_args(kind)
    if get_origin(kind) is dict and isinstance(part, str):
        return args[1]
    if get_origin(kind) is list and isinstance(part, int):
        return args[0]
    if get_origin(kind) is tuple and isinstance(part, int):
        return args[0] if len(args) == 2 and args[1] is Ellipsis else args[part] if part < len(args) else None
    return None


def _migrated(raw: dict, *, source: str) -> dict:
    """Keys renamed since a run directory was written, in today's spelling: ``train.bf16: true`` is
    ``train.precision: bf16`` (``bf16: false`` is the default fp32), so old runs resume unchanged."""
    train = raw.get("train") if isinstance(raw, dict) else None
    if not isinstance(train, dict) or "bf16" not in train:
        return raw
    train = dict(train)
    legacy = train.pop("bf16")
    if not isinstance(legacy, bool):
        raise ConfigError(f"{source}: train.bf16: expected true or false, got {legacy!r} (it is now train.precision: bf16)")
    if legacy and train.setdefault("precision", "bf16") != "bf16":
        raise ConfigError(f"{source}: train.bf16: true and train.precision: {train['precision']} disagree; give precision only")
    return {**raw, "train": train}


def _typed_text(value: object) -> bool:
    """Whether ``value`` is a string that YAML would read as a number or a bool without its quotes."""
    try:
        return isinstance(value, str) and isinstance(parse_value(value), (bool, int, float))
    except yaml.YAMLError:
        return False


def named_entries(task: object) -> Callable[[tuple[str, ...]], bool]:
    """Whether the mapping at a key path of ``task``'s config holds named entries (a ``dict`` in the schema:
    ``data.test``'s test sets), whose entries a ``null`` removes in a file over its base, ``--set`` and a grid's
    ``set:`` (``config_yaml.merge_mapping``); everywhere else null is the value null (everywhere, for an unknown
    task)."""
    try:
        schema = TASKS.entry(task).config if isinstance(task, str) else None
    except ConfigError:
        schema = None

    def named(path: tuple[str, ...]) -> bool:
        kind = schema
        for part in path:
            part = int(part) if part.isdigit() and any(get_origin(b) in (list, tuple) for b in _branches(kind)) \
                else part
            kind = next((child for branch in _branches(kind) if (child := annotation_at(branch, part)) is not None),
                        None)
        return kind is not None and any(get_origin(branch) is dict for branch in _branches(kind))

    return named


def chain_task(chain: list[tuple[Path, dict]]) -> object:
    """The ``task`` a ``load_chain`` gives: the file's own, else its nearest base's."""
    return next((own["task"] for _, own in chain if "task" in own), None)


def load_config(path: str | Path, overrides: list[str] = ()) -> TaskConfig:
    chain = load_chain(path)  # read once: merged here, and traced in errors
    raw = merge_chain(chain, named=named_entries(chain_task(chain)))
    retyped = []
    for assignment in overrides:
        retyped += _retyped(raw, assignment)
        apply_override(raw, assignment, named=named_entries(raw.get("task")))
    source = str(path) + (f" (with --set {' '.join(overrides)})" if overrides else "")
    overridden = assigned_keys(list(overrides))

    def origin(key: str) -> str | None:  # where the key was set: --set, or its line (and file if a base's)
        if sets_key(overridden, key):
            return "from --set"
        found = key_origin(chain, key)
        if found is None:
            return None
        line = key_line(found, key)
        at = f"line {line}" if line is not None else None
        if found == chain[0][0]:
            return at
        return f"set in {found}" + (f", {at}" if at else "")

    try:
        return validate(raw, source=source, origin=origin)
    except ConfigError as err:
        if not retyped:
            raise
        raise ConfigError(f"{err}\n" + "\n".join(retyped)) from None


def _retyped(raw: dict, assignment: str) -> list[str]:
    """A note for ``--set X.type=NEW`` where ``X`` is a component (a part, a mixer) of another type with keys of
    its own: the assignment changes the type only, so the old type's keys stay (window's ``size`` under capsule
    is "unknown"); the note says so and how to replace the whole entry. Empty otherwise."""
    key, _, text = assignment.partition("=")
    parts = key.strip().split(".")
    if parts[-1] != "type":
        return []
    node = raw
    for part in parts[:-1]:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return []
    try:
        new = parse_value(text)
    except yaml.YAMLError:
        return []
    if not isinstance(node, dict) or not isinstance(node.get("type"), str) or node["type"] == new:
        return []
    kept = [k for k in node if k not in ("type", "layers")]
    if not kept:
        return []
    entry = ".".join(parts[:-1])
    layers = f", layers: {format_value(node['layers'])}" if node.get("layers") is not None else ""
    return [f"  note: --set {key.strip()}={text} changed the type of {entry} ({node['type']!r}) and kept its other "
            f"keys ({', '.join(map(str, kept))}); to replace the entry, give it whole: "
            f"--set '{entry}={{type: {new}{layers}}}'"]


def dump_config(config: BaseModel) -> str:
    """The config as YAML that ``load_config`` reads back to the same config (``dump_yaml``: a string the
    loader would read as a number or a bool is quoted), and to the same config under any ``--set``: a key a
    section inherits is left out (``WRITTEN``), so that it follows its source there as in the original file."""
    return dump_yaml(config.model_dump(mode="json", context={WRITTEN: True}))


Config = TaskConfig  # the config of a run, whatever its task
