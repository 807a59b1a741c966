"""Checkpoints: safetensors weights + a resume state, written atomically, pruned to best/last N.

Layout of one checkpoint directory ``checkpoints/step-00001000/``:
    model.safetensors   weights (shared tensors stored once; the same bytes for the same weights: weights_file.py)
    state.pt            optimizer, step, epoch, data position, RNG states (``torch.save``; loaded
                        with ``weights_only=True``)
    meta.json           step, epoch, validation metrics, and the sha256 of the two files above
A checkpoint is first written to a temporary directory, flushed to disk (fsync) and renamed into
place, so a crash or power loss never leaves a half-written checkpoint behind; ``latest.json`` is
replaced the same way. A renamed directory is complete by construction, so if ``latest.json`` names
one that is gone, the newest complete checkpoint is the one to resume from. The checksums catch what
the file formats do not: bytes changed inside a tensor load without complaint (``DamagedCheckpoint``);
checkpoints written before checksums existed load without the check.

A session ended by ``sanlab train --stop-after`` between two validations saves a checkpoint without one
(``RESUME_ONLY`` in its meta.json, no metrics, no score): the next session resumes from it, but it is never a best
or a last-N checkpoint (``best``, ``last``, what ``keep_best`` and ``keep_last`` keep, ``--checkpoint last``), and the
next checkpoint saved replaces it, so the checkpoints a run ends with are those of an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import random
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model
from torch import nn

from sanlab.errors import ConfigError
from sanlab.files import dangling_link, read_json, replace_directory, write_json
from sanlab.training.layout import RunLayout
from sanlab.training.weights_file import save_weights


class DamagedCheckpoint(ConfigError):
    """A checkpoint file that is missing, unreadable or not what was written (its checksum differs)."""


class UnreadableCheckpoint(DamagedCheckpoint):
    """A checkpoint file the operating system would not let us read (permissions, an I/O error, a directory in its
    place): not known to be damaged, so a resume stops at it instead of skipping it (and deleting it after)."""


def _os_refused(path: Path, err: OSError) -> UnreadableCheckpoint:
    return UnreadableCheckpoint(f"{path}: cannot be read ({type(err).__name__}: {err})")


# The files of one checkpoint directory (the run's own files: training/layout.py).
WEIGHTS = "model.safetensors"
STATE = "state.pt"
META = "meta.json"
LATEST = "latest.json"    # in the checkpoints directory: the checkpoint to resume from
STEP_PREFIX = "step-"     # a checkpoint directory: step-00001000
CHECKSUMMED = (WEIGHTS, STATE)
RESUME_ONLY = "resume_only"  # meta.json key: saved by --stop-after without a validation (see the module's doc)


def step_name(step: int) -> str:
    """The directory name of the checkpoint of update ``step``."""
    return f"{STEP_PREFIX}{step:08d}"


def is_step_name(name: str) -> bool:
    """Whether ``name`` is one ``step_name`` writes (``step-00001000``): a copy beside a checkpoint
    (``step-00001000.bak``), a user's ``step-list.txt`` or ``step-avg`` is not a checkpoint of the run."""
    digits = re.fullmatch(rf"{re.escape(STEP_PREFIX)}(\d+)", name)
    return digits is not None and step_name(int(digits.group(1))) == name


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checksums(directory: Path) -> dict[str, str]:
    """sha256 of the checkpoint files in ``directory`` (recorded in its meta.json as ``sha256``)."""
    return {name: file_sha256(Path(directory) / name) for name in CHECKSUMMED if (Path(directory) / name).exists()}


def verify(path: Path) -> None:
    """Check ``path`` (a file of a checkpoint) against the sha256 its meta.json recorded, if any."""
    path = Path(path)
    meta_path = path.parent / META
    try:
        meta = read_json(meta_path) or {}
    except ConfigError as err:
        raise DamagedCheckpoint(str(err)) from None
    recorded = _checked_sha256(meta, meta_path)
    expected = recorded.get(path.name)
    if "sha256" in meta and expected is None and path.name in CHECKSUMMED and path.exists():
        # sanlab records every file it wrote: one left out (or all of them: an empty "sha256", which sanlab never
        # writes) was edited away, and would load unchecked. Only a meta.json without the key predates checksums.
        raise DamagedCheckpoint(f"{meta_path}: damaged: \"sha256\" records no checksum of {path.name}, which sanlab "
                                "writes with the others")
    if expected is not None and path.exists() and file_sha256(path) != expected:
        raise DamagedCheckpoint(f"{path}: damaged: its sha256 differs from the one recorded when it was written")


def _checked_sha256(meta: dict, path: Path, remedy: str | None = None) -> dict:
    """``meta``'s checksums (``{}`` if it records none, as before checksums existed): file name -> sha256, or a
    DamagedCheckpoint naming ``path`` (the meta.json) and ``remedy``."""
    sha256 = meta.get("sha256", {})
    if not isinstance(sha256, dict) or not all(isinstance(v, str) for v in sha256.values()):
        raise DamagedCheckpoint(f"{path}: damaged: \"sha256\" is {json.dumps(sha256)[:80]}, not the file names and "
                                "checksums sanlab writes" + (f"; {remedy}" if remedy else ""))
    return sha256


def rng_state(device: torch.device | None = None) -> dict:
    """The random streams a resumed run must continue: the CPU generator, Python's, and the CUDA generators
    where CUDA is in use (dropout on a GPU draws from those), with the index of the GPU this process trains on
    when ``device`` is one (``cuda_device``): a resume on another GPU continues that GPU's stream."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
        if device is not None and torch.device(device).type == "cuda":
            state["cuda_device"] = _cuda_index(torch.device(device))
    return state


def set_rng_state(state: dict, device: torch.device | None = None) -> str | None:
    """Restore what ``rng_state`` saved. The stream of the GPU the run trained on goes to the GPU it resumes on
    (``device``); a checkpoint that does not say which GPU that was (written before ``cuda_device`` existed)
    gives each GPU the stream of its index. What cannot be continued (a GPU run resumed on the CPU, a CPU run
    on a GPU, or a GPU run on a GPU the checkpoint has no stream of) is returned as a sentence for the log, since the resume is then not
    the run it was."""
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    cuda = state.get("cuda")
    device = torch.device(device) if device is not None else torch.device("cpu")
    if cuda is None:  # written by a run on the CPU (a GPU run has begun CUDA's streams by its first checkpoint)
        return None if device.type != "cuda" else (f"the checkpoint was written by a run on the CPU and this run "
                                                   f"computes on {device}: its dropout draws start anew")
    own = state.get("cuda_device")
    if device.type == "cuda" and isinstance(own, int) and 0 <= own < len(cuda):
        torch.cuda.set_rng_state(cuda[own], _cuda_index(device))  # the stream dropout drew from, on this GPU
        return None
    here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index in range(min(len(cuda), here)):
        torch.cuda.set_rng_state(cuda[index], index)
    if device.type != "cuda":
        return (f"the checkpoint has the random streams of {len(cuda)} GPU(s) and this run computes on {device}: "
                "its dropout draws start anew")
    if (device.index or 0) >= len(cuda):
        return (f"the checkpoint has the random streams of {len(cuda)} GPU(s), none for {device}: its dropout "
                "draws start anew")
    return None


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


def complete_checkpoints(directory: Path) -> list[dict]:
    """Meta (plus ``path``) of every checkpoint in ``directory``, oldest first. A ``step-N`` directory is
    complete by construction (written under a temporary name, then renamed), so one without a readable
    ``meta.json`` was damaged afterwards: an error naming it, never a checkpoint to skip (training would
    start again and write over it). One pruned between listing and reading (a training process beside a
    reader renames it away whole) is left out: it is gone, not damaged."""
    named = (d for d in sorted(Path(directory).glob(f"{STEP_PREFIX}*")) if is_step_name(d.name) and d.is_dir())
    listed = ((d, _meta_unless_pruned(d)) for d in named)
    return [{**meta, "path": str(d)} for d, meta in listed if meta is not None]


def _meta_unless_pruned(checkpoint: Path) -> dict | None:
    """``read_meta``, or None for a checkpoint that is gone (pruned since it was named): gone, not damaged."""
    try:
        return read_meta(checkpoint)
    except ConfigError:
        if checkpoint.is_dir():
            raise
        return None


def read_meta(checkpoint: Path) -> dict:
    """A ``step-N`` checkpoint's meta.json; damaged or missing, an error naming the checkpoint and what to do."""
    checkpoint = Path(checkpoint)
    # (said to every reader of the run's checkpoints: training, averaging, decoding with the best)
    remedy = (f"move {checkpoint.name} out of {checkpoint.parent} (or restore the file): the run's checkpoints are read "
              "only once it is whole or gone, and training then resumes from the checkpoint before it")
    meta = read_json(checkpoint / META, remedy=remedy)
    if meta is None:
        raise ConfigError(f"{checkpoint}: checkpoint without {META} (written complete, so it was removed since); "
                          f"{remedy}")
    _check_meta(meta, checkpoint / META, remedy)
    return meta


def _check_meta(meta: dict, path: Path, remedy: str) -> None:
    """What the checkpoints' listing, ordering and checks read of a meta.json, of the types sanlab writes: an
    edited or foreign one is a DamagedCheckpoint naming ``path``, not a KeyError or TypeError deep inside."""
    step, score = meta.get("step"), meta.get("score")
    if not isinstance(step, int) or isinstance(step, bool):
        found = f"is {json.dumps(step)[:80]}" if "step" in meta else "is missing"
        raise DamagedCheckpoint(f"{path}: damaged: \"step\" {found}, not the update number; {remedy}")
    if score is not None and (isinstance(score, bool) or not isinstance(score, numbers.Real)):
        raise DamagedCheckpoint(f"{path}: damaged: \"score\" is {json.dumps(score)[:80]}, not a number or null; "
                                f"{remedy}")
    _checked_sha256(meta, path, remedy)


def check_vocabulary(checkpoint: Path, vocabulary: str | None, *, run_dir: Path) -> None:
    """Refuse weights trained with another vocabulary than ``run_dir``'s (``vocabulary``: its digest, None where
    its task keeps none): rows of another subword model or word list would be read as this run's, and every
    score would be of nonsense. A checkpoint that records none (written before it was kept) is taken."""
    recorded = (read_json(Path(checkpoint) / META) or {}).get("vocabulary")
    if vocabulary is None or recorded is None or recorded == vocabulary:
        return
    if RunLayout(run_dir).name_in_run(checkpoint) is not None:  # the run's own: "use its own run" is no help
        raise ConfigError(f"{checkpoint}: trained with another vocabulary (subword model or word list: {recorded}) "
                          f"than {run_dir}'s subword model or word list gives now ({vocabulary}): that file (or, where "
                          "the run keeps no word list, the data it is built from) was replaced or damaged since the "
                          "checkpoint was written, or the checkpoint was copied in from another run; restore the file, "
                          "or move the checkpoint out")
    raise ConfigError(f"{checkpoint}: trained with another vocabulary (subword model or word list: {recorded}) than "
                      f"the run {run_dir} ({vocabulary}); load it with the run it was trained in")


def common_vocabulary(checkpoints: list[Path]) -> str | None:
    """The vocabulary the ``checkpoints`` were trained with (None if none records one), for an average of them;
    an error when they differ (their rows mean other pieces: an average would be nonsense)."""
    found = {str(c): (read_json(Path(c) / META) or {}).get("vocabulary") for c in checkpoints}
    kinds = {v for v in found.values() if v is not None}
    if len(kinds) > 1:
        listed = ", ".join(f"{c}: {v}" for c, v in found.items())
        raise ConfigError(f"the checkpoints were trained with different vocabularies ({listed}); average checkpoints "
                          "of one run")
    return next(iter(kinds), None)


def latest_checkpoint(directory: Path) -> Path | None:
    """The checkpoint ``latest.json`` names; if it is gone, the newest complete one (or None). Reads only."""
    pointer = Path(directory) / LATEST
    latest = read_json(pointer)
    if latest is not None:
        if not isinstance(latest.get("checkpoint"), str) or not is_step_name(latest["checkpoint"]):
            raise ConfigError(f"{pointer}: expected {{\"checkpoint\": \"step-N\"}}, found {latest}; delete it to "
                              "resume from the newest complete checkpoint")
        path = Path(directory) / latest["checkpoint"]
        if _meta_unless_pruned(path) is not None:  # damaged: an error, not a fall-back training would write over
            return path
    complete = complete_checkpoints(directory)
    return Path(complete[-1]["path"]) if complete else None


def check_checkpoints_link(run_dir: Path) -> None:
    """Refuse a run whose ``checkpoints/`` is a file (it failed with a bare "Not a directory"), or a symbolic link to
    what is not there (a disk not mounted): read, it looks like a run without checkpoints (evaluate: "train first";
    a resume: a fresh start), and a new run or ``--overwrite`` would replace the link. Nothing is deleted: the user
    mounts the disk or removes the link."""
    link = RunLayout(run_dir).checkpoints
    if link.exists() and not link.is_dir():
        what = f"a symbolic link to {os.readlink(link)}, which is a file" if link.is_symlink() else "a file"
        raise ConfigError(f"{link} is {what}, not a directory of checkpoints (move the file out of the run, or point "
                          "the link at a directory)")
    dangling = dangling_link(link)
    if dangling:
        raise ConfigError(f"{link} is {dangling}")


class CheckpointManager:
    """Saves, lists, loads and prunes the checkpoints of one run directory."""

    def __init__(self, run_dir: Path, *, keep_best: int, keep_last: int, higher_is_better: bool,
                 writer: bool = True):
        """``writer=False``: read only (the non-main processes of a distributed run)."""
        check_checkpoints_link(run_dir)
        self.dir = RunLayout(run_dir).checkpoints
        self.keep_best, self.keep_last, self.higher_is_better = keep_best, keep_last, higher_is_better
        if writer:
            self.dir.mkdir(parents=True, exist_ok=True)
            for stale in [*self.dir.glob(f".{STEP_PREFIX}*.tmp"), *self.dir.glob(f".{STEP_PREFIX}*.old")]:  # left by a crash
                _delete_tree(stale)

    @staticmethod
    def has_checkpoints(run_dir: Path) -> bool:
        return latest_checkpoint(RunLayout(run_dir).checkpoints) is not None

    def save(self, *, model: nn.Module, state: dict, meta: dict) -> Path:
        name = step_name(meta['step'])
        final, tmp = self.dir / name, self.dir / f".{name}.tmp"
        _delete_tree(tmp)
        tmp.mkdir()
        save_weights(model, tmp / WEIGHTS)
        torch.save(state, tmp / STATE)
        meta = {**meta, "sha256": checksums(tmp)}
        (tmp / META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
        # a step-N linked in from elsewhere, saved again: replace_directory sets the link aside and removes it (never
        # what it points to) only once the new checkpoint lies in the run; a rename that fails puts it back. As for
        # any checkpoint saved again, a crash between its two renames leaves the old one (the link) as .step-N.*.old,
        # removed at the next start, which then resumes from the newest complete checkpoint
        replace_directory(tmp, final)
        write_json(self.dir / LATEST, {"checkpoint": name})
        self.prune()
        return final

    def all(self) -> list[dict]:
        """Meta of every complete checkpoint, oldest first."""
        return complete_checkpoints(self.dir)

    def latest(self) -> Path | None:
        return latest_checkpoint(self.dir)

    def best(self, n: int | None = None) -> list[Path]:
        """The ``n`` best-scoring checkpoints, best first; of equal scores the newest first (as fairseq's
        checkpoint_best, which a tie replaces): early validations often tie, e.g. at BLEU 0."""
        scored = [m for m in self.all() if m.get("score") is not None]
        sign = 1 if self.higher_is_better else -1
        scored.sort(key=lambda m: (sign * m["score"], m["step"]), reverse=True)
        return [Path(m["path"]) for m in scored[: n or len(scored)]]

    def last(self, n: int) -> list[Path]:
        """The ``n`` newest validated checkpoints (a ``--stop-after`` one, ``RESUME_ONLY``, is left out)."""
        return [Path(m["path"]) for m in self.validated()[-n:]]

    def validated(self) -> list[dict]:
        """Meta of every complete checkpoint but the ``RESUME_ONLY`` ones, oldest first."""
        return [m for m in self.all() if not m.get(RESUME_ONLY)]

    def resume_candidates(self) -> list[Path]:
        """Checkpoints to resume from, best choice first: the latest, then the older ones, newest first."""
        latest = self.latest()
        older = [Path(m["path"]) for m in reversed(self.all()) if latest is None or m["step"] < _step(latest)]
        return ([latest] if latest else []) + older

    def discard_after(self, step: int) -> None:
        """Remove checkpoints newer than ``step`` (a crash between writing one and updating ``latest.json``)."""
        for m in self.all():
            if m["step"] > step:
                _remove(Path(m["path"]))

    def discard_resume_only(self, *, but: Path) -> None:
        """Remove the ``RESUME_ONLY`` checkpoints other than ``but`` (the one resumed from): one older than the latest
        outlives its session when a crash comes between writing ``latest.json`` and ``prune``, and a run that then
        saves nothing more (its budget ends there) would keep it. Only this run's ``step-N`` checkpoints."""
        for m in self.all():
            if m.get(RESUME_ONLY) and Path(m["path"]) != Path(but):
                _remove(Path(m["path"]))

    def prune(self) -> None:
        """Keep the best and the last N validated ones, and the latest (resumed from); a ``RESUME_ONLY`` checkpoint
        is kept only while it is the latest, and does not push a validated one out of the last N."""
        keep = set(self.best(self.keep_best)) | set(self.last(self.keep_last))
        latest = self.latest()
        for m in self.all():
            path = Path(m["path"])
            if path not in keep and path != latest:
                _remove(path)


def _step(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix(STEP_PREFIX))


def checkpoint_names(run_dir: Path) -> list[str]:
    """The ``step-N`` checkpoints of a run, oldest first."""
    return [Path(m["path"]).name for m in complete_checkpoints(RunLayout(run_dir).checkpoints)]


def _remove(checkpoint: Path) -> None:
    """Rename out of the ``step-*`` namespace first, so that a reader (``sanlab translate`` beside the
    training) never sees a half-deleted checkpoint; a crash leaves ``.old``, cleared at the next start."""
    doomed = checkpoint.with_name(f".{checkpoint.name}.old")
    try:
        checkpoint.rename(doomed)
    except FileNotFoundError:
        return
    _delete_tree(doomed)


def _delete_tree(path: Path) -> None:
    """Delete the directory ``path``; a symbolic link (a ``step-N`` linked in from elsewhere) is removed as a link:
    what it points to is never the run's to delete (rmtree refuses a link, and ignoring that left it for good)."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def read_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``checkpoint``/model.safetensors (for averaging); an unreadable file is a one-line error."""
    path = Path(checkpoint) / WEIGHTS
    try:
        verify(path)  # (inside: a file that cannot be opened to hash it is unreadable, not a traceback)
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise _unreadable(path, err) from None


def _unreadable(path: Path, err: Exception) -> ConfigError:
    """The one message for a model.safetensors that cannot be read, shared by loading and averaging."""
    if isinstance(err, FileNotFoundError):
        return DamagedCheckpoint(f"{path.parent}: no {WEIGHTS} in this checkpoint directory")  # as load_trained
    if isinstance(err, OSError):
        return _os_refused(path, err)
    return DamagedCheckpoint(f"{path}: damaged, not a readable safetensors file ({err})")


def load_weights(model: nn.Module, checkpoint: Path) -> None:
    """Load ``checkpoint``'s weights into ``model``. A checkpoint directory that is gone (pruned by a training
    process since it was chosen) raises FileNotFoundError, so that the caller can choose again; a directory
    without its weights, or with damaged ones, is a DamagedCheckpoint."""
    path = Path(checkpoint) / WEIGHTS
    try:
        verify(path)
        load_model(model, str(path))
    except FileNotFoundError as err:
        if not path.parent.is_dir():
            raise FileNotFoundError(f"{path.parent} was removed") from None
        raise _unreadable(path, err) from None
    except (SafetensorError, OSError) as err:
        raise _unreadable(path, err) from None
    except RuntimeError as err:  # missing, unexpected or differently shaped tensors
        detail = " ".join(str(err).split())
        raise ConfigError(f"{path}: holds the weights of another model than this run's config builds: "
                          f"{detail[:300]}{'...' if len(detail) > 300 else ''}") from None


def load_state(checkpoint: Path) -> dict:
    path = Path(checkpoint) / STATE
    if not path.is_file():
        raise DamagedCheckpoint(f"{path}: missing: the checkpoint cannot be resumed from (its weights still load)")
    try:
        verify(path)  # (inside: a file that cannot be opened to hash it is unreadable, as for torch.load)
        # on the CPU: a state written on a GPU (optimizer moments on cuda) must load on a machine without one;
        # the optimizer moves it to its parameters' device
        return torch.load(path, weights_only=True, map_location="cpu")
    except DamagedCheckpoint:
        raise
    except OSError as err:
        raise _os_refused(path, err) from None
    except Exception as err:  # noqa: BLE001  (damage shows as RuntimeError, UnpicklingError, KeyError, EOFError...)
        raise DamagedCheckpoint(f"{path}: damaged, cannot be read ({type(err).__name__}: {err})") from None
