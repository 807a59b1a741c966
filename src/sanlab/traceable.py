"""``dataclasses.replace`` for code that runs inside ``torch.compile`` (the attention's forward).

torch 2.5 and 2.6's dynamo cannot trace the standard library's ``replace`` (2.5 skips the function, 2.6 stops at
its ``hasattr(cls, "__dataclass_fields__")``), nor, on some classes, ``dataclasses.fields``: every attention call
broke the graph there, 20 breaks in a 3+3-layer Transformer (``tests/training/test_compile.py`` on those
torches). ``replace`` here builds the new object from the init fields that ``@replaceable`` recorded when the
class was defined, which dynamo traces on every torch sanlab supports; the result is the standard library's. From torch
2.7 on the standard library's traces too (checked on 2.7.1 to 2.14.1, results/torch-versions.md): this module is
for 2.5 and 2.6, which pyproject admits.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")
_INIT_FIELDS: dict[type, tuple[str, ...]] = {}


def replaceable(cls: type[T]) -> type[T]:
    """Class decorator, above ``@dataclass``: records the class's init fields for ``replace``, outside any trace."""
    _INIT_FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.init)
    return cls


def replace(obj: T, **changes: Any) -> T:
    """A copy of the ``@replaceable`` dataclass instance ``obj`` with ``changes``; an unknown or non-init field
    is a TypeError."""
    cls = type(obj)
    if cls not in _INIT_FIELDS:
        raise TypeError(f"{cls.__qualname__} is not @replaceable (sanlab.traceable)")
    return cls(**{**{name: getattr(obj, name) for name in _INIT_FIELDS[cls]}, **changes})
