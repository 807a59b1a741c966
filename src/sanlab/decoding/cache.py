"""Decoding caches are plain data; one generic ``reorder`` makes them follow the beams.

A cache is any nesting of dataclasses (e.g. ``KV(k, v)``), tuples (named or not), lists and
dicts whose leaves are tensors or plain values (ints, strings, None). Dimension 0 of every
tensor is the batch (times beam): that is the one contract between the parts that fill a
cache and the search that reorders it, so no module reads another module's cache internals
(the idea of OpenNMT-py's ``map_state(fn)`` and fairseq's ``reorder_incremental_state``).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import torch
from torch import Tensor


def reorder(cache: Any, index: Tensor) -> Any:
    """A new cache in which every tensor ``x`` is ``x.index_select(0, index)``.

    ``index`` is a 1-D integer tensor of rows to take (repeat, permute or drop). Non-tensor
    leaves are kept as they are; the containers are new, the input is left untouched.
    """
    return _map_tensors(cache, lambda x: x.index_select(0, index.to(x.device)))


def expand_for_beams(cache: Any, beam_size: int) -> Any:
    """Repeat every batch row ``beam_size`` times: row ``b`` becomes rows ``b*k .. b*k+k-1``.

    Equal to ``reorder(cache, arange(B).repeat_interleave(beam_size))``, so dimension 0 of every
    tensor in the cache must be the batch ``B``; a cache whose tensors disagree on it is refused.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    tensors = _tensors(cache)
    sizes = sorted({x.shape[0] for x in tensors})
    if not sizes:
        return _map_tensors(cache, lambda x: x)
    if len(sizes) > 1:
        raise ValueError(f"every cached tensor needs the batch on dim 0, but dim 0 sizes differ: {sizes}")
    index = torch.arange(sizes[0], device=tensors[0].device).repeat_interleave(beam_size)  # [B*k]
    return reorder(cache, index)


def _tensors(cache: Any) -> list[Tensor]:
    found: list[Tensor] = []
    _map_tensors(cache, lambda x: found.append(x) or x)
    return found


def _map_tensors(cache: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    """Apply ``fn`` to every tensor in ``cache``, rebuilding the containers around the results."""
    if isinstance(cache, Tensor):
        return fn(cache)
    if dataclasses.is_dataclass(cache) and not isinstance(cache, type):
        return _map_dataclass(cache, fn)
    if isinstance(cache, tuple) and hasattr(cache, "_fields"):  # a namedtuple
        return type(cache)(*(_map_tensors(item, fn) for item in cache))
    if isinstance(cache, (tuple, list)):
        return type(cache)(_map_tensors(item, fn) for item in cache)
    if isinstance(cache, dict):
        out = copy.copy(cache)  # keeps the dict's type (OrderedDict, defaultdict, ...)
        for key, value in cache.items():
            out[key] = _map_tensors(value, fn)
        return out
    return cache


def _map_dataclass(cache: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    fields = dataclasses.fields(cache)
    changes = {f.name: _map_tensors(getattr(cache, f.name), fn) for f in fields if f.init}
    out = dataclasses.replace(cache, **changes)
    for f in fields:
        # replace() cannot pass init=False fields; set them the way a frozen dataclass does itself
        if not f.init and hasattr(cache, f.name):
            object.__setattr__(out, f.name, _map_tensors(getattr(cache, f.name), fn))
    return out
