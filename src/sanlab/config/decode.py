"""The ``decode:`` section (``DecodeConfig``): beam search's settings, how records written before a key was added
compare with it (``DecodeConfig.as_recorded``), and settings changed from the command line (``updated``).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, ValidationError, model_validator

from sanlab.config.fields import Strict
from sanlab.errors import ConfigError
from sanlab.registry import rule_words


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
                                 + rule_words(e) for e in err.errors())
            raise ConfigError(f"invalid decode settings: {problems}") from None
