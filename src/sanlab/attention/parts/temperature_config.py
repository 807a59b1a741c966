"""Config of the learnable temperature (``type: temperature``), torch-free; the part and its builder are in
``temperature.py``."""

from __future__ import annotations

from typing import Literal

from sanlab.attention.registry import PartConfig


class TemperatureConfig(PartConfig):
    """Per-head scalars gamma_q, gamma_k, gamma_v on the projections (every layer by default)."""

    type: Literal["temperature"] = "temperature"
    builder = "sanlab.attention.parts.temperature:build_temperature"
