"""Config of capsule routing (``type: capsule``), torch-free; the part and its builder are in ``capsule.py``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sanlab.attention.registry import PartConfig


class CapsuleConfig(PartConfig):
    """Capsule routing; every ambiguity of the spec (section 12) is a setting, defaults as in the spec."""

    type: Literal["capsule"] = "capsule"
    builder = "sanlab.attention.parts.capsule:build_capsule"
    routing_iters: int = Field(3, ge=1)                           # R (A6)
    routing_input: Literal["scores", "probs"] = "scores"          # A1: zero-filled scores or probabilities
    use_vertical: bool = True                                     # ignored (off) in the decoder
    use_horizontal: bool = True
    horizontal_mode: Literal["positional", "global"] = "positional"  # A7; global: encoder only
    acceptance_init: Literal["xavier", "identity", "zeros"] = "xavier"  # A5
    acceptance_act: Literal["none", "sigmoid"] = "none"           # A4
    routing_detach_logits: bool = False                           # A9

    @classmethod
    def examples(cls) -> list["CapsuleConfig"]:
        return [cls(),
                cls(routing_input="probs", routing_iters=1, acceptance_init="identity", acceptance_act="sigmoid"),
                cls(use_horizontal=False, routing_iters=2, routing_detach_logits=True),
                cls(acceptance_init="zeros")]  # Ver starts at 0: the unperturbed contracts run it so
