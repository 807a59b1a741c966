"""Decoding caches are plain data; one generic ``reorder`` makes them follow the beams.

A cache is any nesting of dataclasses (e.g. ``KV(k, v)``), tuples (named or not), lists and
dicts whose leaves are tensors or plain values (ints, strings, None). Dimension 0 of every
tensor is the batch (times beam): that is the one contract between the parts that fill a
cache and the search that reorders it, so no module reads another module's cache internals
(the idea of OpenNMT-py's ``map_state(fn)`` and fairseq's ``reorder_incremental_state``).
Any other object is a leaf passed on as it is, tensors inside it untouched: it must tell by itself
when the rows changed under it (``positions.MemoryKeys`` checks that its ``memory_valid`` is still the
cache's own).

Some rows are the same in every beam of a sentence: the encoder output, its mask and the cross-attention keys
and values, all made from the source. A dataclass says which of its fields hold such rows in a class attribute
``beam_shared_fields`` (a tuple of field names; asked by name, so no floor imports this one for it), and a
beam-search step in which no sentence leaves (``reorder(..., within_sentences=True)``) leaves those fields where
they are instead of copying them: moving rows among equal rows changes nothing.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import torch
from torch import Tensor


def reorder(cache: Any, index: Tensor, *, within_sentences: bool = False) -> Any:
    """A new cache in which every tensor ``x`` is ``x.index_select(0, index)``.

    ``index`` is a 1-D integer tensor of rows to take (repeat, permute or drop). Non-tensor
    leaves are kept as they are; the containers are new, the input is left untouched.

    ``within_sentences``: the caller vouches that ``index`` takes every row from the rows of its own sentence
    (rows ``s*k .. s*k+k-1``, k beams, none dropped), so the fields a dataclass names in ``beam_shared_fields``,
    equal in those rows, are kept as they are (the same tensors, not copies). Unchecked: checking would read the
    index on the host.
    """
    return _map_tensors(cache, lambda x: x.index_select(0, index.to(x.device)), keep_shared=within_sentences)


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


def _map_tensors(cache: Any, fn: Callable[[Tensor], Tensor], *, keep_shared: bool = False) -> Any:
    """Apply ``fn`` to every tensor in ``cache``, rebuilding the containers around the results; with
    ``keep_shared``, not to the fields a dataclass names in ``beam_shared_fields``."""
    if isinstance(cache, Tensor):
        return fn(cache)
    if dataclasses.is_dataclass(cache) and not isinstance(cache, type):
        return _map_dataclass(cache, fn, keep_shared=keep_shared)
    if isinstance(cache, tuple) and hasattr(cache, "_fields"):  # a namedtuple
        return type(cache)(*(_map_tensors(item, fn, keep_shared=keep_shared) for item in cache))
    if isinstance(cache, (tuple, list)):
        return type(cache)(_map_tensors(item, fn, keep_shared=keep_shared) for item in cache)
    if isinstance(cache, dict):
        out = copy.copy(cache)  # keeps the dict's type (OrderedDict, defaultdict, ...)
        for key, value in cache.items():
            out[key] = _map_tensors(value, fn, keep_shared=keep_shared)
        return out
    return cache


def _map_dataclass(cache: Any, fn: Callable[[Tensor], Tensor], *, keep_shared: bool) -> Any:
    fields = dataclasses.fields(cache)
    shared = _shared_fields(type(cache), fields) if keep_shared else ()

    def mapped(f: dataclasses.Field) -> Any:
        value = getattr(cache, f.name)
        return value if f.name in shared else _map_tensors(value, fn, keep_shared=keep_shared)

    out = dataclasses.replace(cache, **{f.name: mapped(f) for f in fields if f.init})
    for f in fields:
        # replace() cannot pass init=False fields; set them the way a frozen dataclass does itself
        if not f.init and hasattr(cache, f.name):
            object.__setattr__(out, f.name, mapped(f))
    return out


def _shared_fields(cls: type, fields: tuple[dataclasses.Field, ...]) -> tuple[str, ...]:
    """The class's ``beam_shared_fields``, each checked to be one of its fields (a misspelt name would
    silently copy the field again)."""
    shared = tuple(getattr(cls, "beam_shared_fields", ()))
    unknown = set(shared) - {f.name for f in fields}
    if unknown:
        raise TypeError(f"{cls.__name__}.beam_shared_fields names {sorted(unknown)}, which are not its fields")
    return shared
