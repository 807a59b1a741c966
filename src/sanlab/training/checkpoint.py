"""Checkpoints: safetensors weights + a resume state, written atomically, pruned to best/last N.

Layout of one checkpoint directory ``checkpoints/step-00001000/``:
    model.safetensors   weights (shared tensors stored once)
    state.pt            optimizer, step, epoch, data position, RNG states (``torch.save``; loaded
                        with ``weights_only=True``)
    meta.json           step, epoch, validation metrics
A checkpoint is first written to a temporary directory and renamed into place, so a crash
never leaves a half-written checkpoint behind; ``latest.json`` is replaced atomically too.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from torch import nn


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


class CheckpointManager:
    """Saves, lists, loads and prunes the checkpoints of one run directory."""

    def __init__(self, run_dir: Path, *, keep_best: int, keep_last: int, higher_is_better: bool):
        self.dir = Path(run_dir) / "checkpoints"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keep_best, self.keep_last, self.higher_is_better = keep_best, keep_last, higher_is_better

    @staticmethod
    def has_checkpoints(run_dir: Path) -> bool:
        return (Path(run_dir) / "checkpoints" / "latest.json").exists()

    def save(self, *, model: nn.Module, state: dict, meta: dict) -> Path:
        name = f"step-{meta['step']:08d}"
        final, tmp = self.dir / name, self.dir / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_model(model, str(tmp / "model.safetensors"))
        torch.save(state, tmp / "state.pt")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _write_json_atomic(self.dir / "latest.json", {"checkpoint": name})
        self.prune()
        return final

    def all(self) -> list[dict]:
        """Meta of every complete checkpoint, oldest first."""
        metas = []
        for d in sorted(self.dir.glob("step-*")):
            if (d / "meta.json").exists():
                metas.append({**json.loads((d / "meta.json").read_text()), "path": str(d)})
        return metas

    def latest(self) -> Path | None:
        pointer = self.dir / "latest.json"
        if not pointer.exists():
            return None
        path = self.dir / json.loads(pointer.read_text())["checkpoint"]
        return path if (path / "meta.json").exists() else None

    def best(self, n: int | None = None) -> list[Path]:
        scored = [m for m in self.all() if m.get("score") is not None]
        scored.sort(key=lambda m: m["score"], reverse=self.higher_is_better)
        return [Path(m["path"]) for m in scored[: n or len(scored)]]

    def last(self, n: int) -> list[Path]:
        return [Path(m["path"]) for m in self.all()[-n:]]

    def discard_after(self, step: int) -> None:
        """Remove checkpoints newer than ``step`` (a crash between writing one and updating ``latest.json``)."""
        for m in self.all():
            if m["step"] > step:
                shutil.rmtree(m["path"], ignore_errors=True)

    def prune(self) -> None:
        keep = set(self.best(self.keep_best)) | set(self.last(self.keep_last))
        latest = self.latest()
        for m in self.all():
            path = Path(m["path"])
            if path not in keep and path != latest:
                shutil.rmtree(path, ignore_errors=True)


def load_weights(model: nn.Module, checkpoint: Path) -> None:
    load_model(model, str(Path(checkpoint) / "model.safetensors"))


def load_state(checkpoint: Path) -> dict:
    return torch.load(Path(checkpoint) / "state.pt", weights_only=True)
