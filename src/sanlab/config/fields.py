"""What every section of the config schema is built from: ``Strict``, a pydantic model that refuses an unknown
key and assigns only valid values (``registry.STRICT_SCHEMA``), and the bounds that many keys share.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from sanlab.registry import STRICT_SCHEMA

# Bounds shared by many keys: a value outside them is a config error naming the key, not a traceback from
# deep inside data preparation (or, worse, a silent meaning such as "all" or "never").
Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, lt=1)]  # dropout, smoothing, decay rates


class Strict(BaseModel):
    model_config = STRICT_SCHEMA
