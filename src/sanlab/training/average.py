"""Checkpoint averaging (Vaswani et al. 2017, 6.1): the fp32 mean of the last or best N weights."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from sanlab.errors import ConfigError
from sanlab.files import read_json, replace_directory, staging_directory, write_json
from sanlab.training.checkpoint import META, WEIGHTS, checksums, common_vocabulary, read_weights
from sanlab.training.weights_file import write_weights


def average_weights(checkpoints: list[Path]) -> dict[str, torch.Tensor]:
    """The mean of each floating-point tensor, summed in float64 and returned in fp32; a tensor of another kind
    (an integer counter, a boolean mask) is not a weight to average and comes from the newest checkpoint (the
    highest step its meta.json records; of those recording none, the last given): with ``--best N`` the list is
    in score order, and its last is the worst, not the latest."""
    if not checkpoints:
        raise ValueError("no checkpoints to average")
    newest = max(range(len(checkpoints)), key=lambda i: (_step(checkpoints[i]), i))
    total: dict[str, torch.Tensor] = {}
    first: dict[str, tuple] = {}
    for index, path in enumerate(checkpoints):
        weights = read_weights(path)
        if first and weights.keys() != first.keys():
            raise ConfigError(f"{path}: its tensors differ from {checkpoints[0]}'s; cannot average different models")
        for name, tensor in weights.items():
            kind = (tuple(tensor.shape), tensor.dtype)
            if first.setdefault(name, kind) != kind:
                raise ConfigError(f"{path}: {name} is {kind[1]} of shape {list(kind[0])}, {checkpoints[0]} has "
                                  f"{first[name][1]} of shape {list(first[name][0])}; cannot average different models")
            if tensor.is_floating_point():
                total[name] = total.get(name, 0) + tensor.double()
            elif index == newest:
                total[name] = tensor
    return {name: ((t / len(checkpoints)).float() if t.is_floating_point() else t).contiguous()
            for name, t in total.items()}


def _step(checkpoint: Path) -> int:
    try:
        step = (read_json(Path(checkpoint) / META) or {}).get("step")
    except ConfigError:  # a damaged meta.json: its weights are still read (and checked) below
        return -1
    return step if isinstance(step, int) else -1


def is_averaged_checkpoint(path: Path) -> bool:
    """A directory this module wrote: its meta.json lists the checkpoints it averages."""
    try:
        return path.is_dir() and "averaged" in (read_json(path / META) or {})
    except ConfigError:  # a damaged meta.json: not ours to replace
        return False


def foreign_in_average(directory: Path) -> list[str]:
    """What an averaged checkpoint directory holds besides the files ``write_average`` writes (replacing it, or
    ``--overwrite`` of its run, would delete them)."""
    return sorted(n for n in os.listdir(directory) if n not in (WEIGHTS, META))


def write_average(checkpoints: list[Path], output: Path, *, selection: str | None = None) -> Path:
    """Write the averaged weights to the checkpoint directory ``output`` (atomically). Its meta.json names the
    checkpoints by their directory names (however the run's path was spelled) and, as ``selection``, how they
    were chosen ("last 5", "best 3"), which ``stale_average`` checks against the run later."""
    output = Path(output)
    if output.is_symlink():  # replacing it would replace the link, not the directory it points to
        raise ConfigError(f"{output}: is a symbolic link (to {os.readlink(output)}); refusing to replace it: give "
                          "the directory itself as --output, or a new name")
    if output.exists() and not is_averaged_checkpoint(output):  # it would be deleted and replaced
        raise ConfigError(f"{output}: exists and is not an averaged checkpoint (no meta.json naming the averaged "
                          "checkpoints); refusing to replace it: choose a new --output")
    foreign = foreign_in_average(output) if output.exists() else []
    if foreign:  # replacing the directory would delete them
        raise ConfigError(f"{output}: an averaged checkpoint that also holds files sanlab did not write "
                          f"({', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}); refusing to replace it: "
                          "move them away, or choose a new --output")
    vocabulary = common_vocabulary(checkpoints)
    weights = average_weights(checkpoints)  # (before anything is written: unreadable checkpoints fail here)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging_directory(output)
    try:
        write_weights(weights, tmp / WEIGHTS)
        write_json(tmp / META, {"averaged": [Path(p).name for p in checkpoints], "selection": selection,
                                **({"vocabulary": vocabulary} if vocabulary else {}), "sha256": checksums(tmp)})
        replace_directory(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # ours alone: made above under a new name
        raise
    return output
