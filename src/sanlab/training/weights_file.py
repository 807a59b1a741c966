"""Writing a model.safetensors: the same bytes (and sha256) for the same weights, in any process.

safetensors' ``save_model`` stores one name of each group of tied tensors and records every other name as its own
metadata entry ("alias": "kept name"); safetensors writes those entries from a Rust HashMap, in an order that
differs between processes and between calls, so identical weights gave files with other bytes. Here the kept names
are the ones ``save_model`` keeps (by the rule ``load_model`` applies, which prefers a name the file holds: files of
either writer load into a tied model, which reties nothing: its state dict already shares the tensors), and the
aliases are one metadata entry, a JSON object with sorted keys: one entry has no order to vary.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from sanlab.files import new_file_mode

try:  # safetensors' own rule (private: the fallback below is the same rule, should a release rename it)
    from safetensors.torch import _remove_duplicate_names
except ImportError:  # pragma: no cover - (test_checkpoint_bytes runs the fallback, _tied_groups, in its place)
    _remove_duplicate_names = None

ALIASES = "aliases"  # the metadata entry: {"dropped name": "kept name", ...} of the tied tensors


def model_tensors(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``model``'s tensors to store (one name of each tied group, contiguous, as ``save_model`` stores them) and
    the aliases of the others (dropped name -> kept name)."""
    state = model.state_dict()
    # (safetensors' own rule, so that the kept name is save_model's and load_model's: the first complete name)
    groups = (_remove_duplicate_names or _tied_groups)(state)
    aliases = {name: kept for kept, dropped in groups.items() for name in dropped}
    return {name: t.contiguous() for name, t in state.items() if name not in aliases}, aliases


def write_weights(tensors: dict[str, torch.Tensor], path: Path, *, aliases: dict[str, str] | None = None) -> None:
    """Write ``tensors`` (contiguous, none sharing memory) to ``path``, with the ``aliases`` (if any) of tied ones.
    Without aliases there is no metadata at all, as ``save_model`` writes an untied model."""
    metadata = {ALIASES: json.dumps(aliases, sort_keys=True)} if aliases else None
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, new_file_mode())  # (safetensors makes it 0600: the weights would be the run's one private file)


def save_weights(model: nn.Module, path: Path) -> None:
    """``model``'s weights to ``path`` (loaded by ``safetensors.torch.load_model``)."""
    tensors, aliases = model_tensors(model)
    write_weights(tensors, path, aliases=aliases)


def _tied_groups(state: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """safetensors' ``_remove_duplicate_names`` for tied weights: names of one tensor (the same memory, shape and
    strides), the first in sorted order kept. Views of one buffer that are not the same tensor are left apart (a
    tied weight is the whole tensor under each name)."""
    by_storage: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        if tensor.device.type != "meta" and tensor.numel():
            key = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
            by_storage.setdefault(key, []).append(name)
    groups = {}
    for names in by_storage.values():
        if len(names) > 1:
            kept, *dropped = sorted(names)
            groups[kept] = dropped
    return groups
