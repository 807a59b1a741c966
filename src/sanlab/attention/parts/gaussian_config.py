"""Configs of the Gaussian localness baselines (``type: neighbor``, ``local_hard``, ``local_soft``), torch-free;
the parts and their builders are in ``gaussian.py``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sanlab.attention.registry import PartConfig

LOWER_LAYERS = [0, 1, 2]  # spec B.0: baselines go where CSAN goes, the lowest three encoder layers


class GaussianConfig(PartConfig):
    """Shared settings. ``local_heads``: how many heads (the last ones) carry the bias;
    ``half`` = H/2 (at least 1), ``all`` = H, or a number."""

    layers: list[int] | None = LOWER_LAYERS
    local_heads: int | Literal["half", "all"] = "half"


class NeighborConfig(GaussianConfig):
    """Neighbor: a Gaussian centred on the query; width predicted (csan) or learned per head (sperber)."""

    type: Literal["neighbor"] = "neighbor"
    builder = "sanlab.attention.parts.gaussian:build_neighbor"
    neighbor_mode: Literal["csan", "sperber"] = "csan"
    # sperber: initial s (xnmt: a constant, or log-uniform in [1, 1000]); s = 0 is a zero width, NaN scores
    sigma_init: Annotated[float, Field(gt=0)] | Literal["rand"] = "rand"
    square_sigma: bool = True                     # sperber: sigma = s^2 (xnmt's square_mask_std)

    @classmethod
    def examples(cls) -> list["NeighborConfig"]:
        return [cls(layers=None), cls(layers=None, neighbor_mode="sperber", sigma_init=2.0, local_heads="all")]


class LocalHardConfig(GaussianConfig):
    """Local_Hard: predicted centre, fixed width D (Luong's local-p)."""

    type: Literal["local_hard"] = "local_hard"
    builder = "sanlab.attention.parts.gaussian:build_local_hard"
    window: float = Field(10.0, gt=0)  # D (Luong's empirical 10; the reference code's local_size)
    truncate: bool = False
    luong_exact: bool = False

    @model_validator(mode="after")
    def _truncation_keeps_a_key(self):
        # the nearest key lies within 0.5 of any centre in [0, L - 1]; a narrower truncation can keep none, and the
        # query's local head would then attend to nothing (a zero output, silently)
        if self.truncate and self.window < 0.5:
            raise ValueError(f"window D = {self.window} with truncate: true leaves a query no key when its centre "
                             "falls between two positions; use D >= 0.5 (or truncate: false)")
        return self

    @classmethod
    def examples(cls) -> list["LocalHardConfig"]:
        return [cls(layers=None), cls(layers=None, window=2.0, truncate=True, luong_exact=True),
                cls(layers=None, window=2.0, truncate=True), cls(layers=None, window=2.0, luong_exact=True)]


class LocalSoftConfig(GaussianConfig):
    """Local_Soft: predicted centre and width (query-specific by default, all heads local)."""

    type: Literal["local_soft"] = "local_soft"
    builder = "sanlab.attention.parts.gaussian:build_local_soft"
    local_heads: int | Literal["half", "all"] = "all"
    window: Literal["query", "layer", "fixed"] = "query"
    fixed_window: float = Field(10.0, gt=0)  # D for window: fixed

    @classmethod
    def examples(cls) -> list["LocalSoftConfig"]:
        return [cls(layers=None), cls(layers=None, window="layer", local_heads="half"),
                cls(layers=None, window="fixed", fixed_window=3.0)]
