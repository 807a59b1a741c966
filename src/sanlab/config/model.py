"""The ``model:`` section: the translation model (``Seq2SeqConfig``, its encoder and decoder ``StackConfig``s) and
the tagger (``TaggerConfig``), with the rules that span a stack's keys: a decoder's ``cross_attention`` inherits
what it does not set from ``attention`` (``sanlab.config.inheritance``), and a part, mixer or pre-block must name
layers the stack has.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, Field, FieldSerializationInfo, field_serializer, model_validator

from sanlab.attention.config import AttentionConfig
from sanlab.config.fields import Fraction, NonNegative, Positive, Strict
from sanlab.config.inheritance import WRITTEN, inherit_unset, inherited_keys
from sanlab.layers.mixers import AttentionMixerConfig, MixerSpec
from sanlab.layers.pre_blocks import PreBlockSpec


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
