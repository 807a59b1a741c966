"""A checkpoint's and an average's model.safetensors are the same bytes (and sha256) for the same weights, in any
process: safetensors' ``save_model`` wrote the tied weights' aliases from a Rust HashMap, in an order that differed
between processes and between calls. Files written so before still load, their ties intact."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_model
from torch import nn

from sanlab.training.average import write_average
from sanlab.training.checkpoint import META, WEIGHTS, CheckpointManager, file_sha256, load_weights


class Tied(nn.Module):
    """Two tied groups, as sanlab's translation models tie theirs (shared embeddings, tied generator): four aliases,
    which safetensors' HashMap wrote in any of 24 orders."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.src_embed = nn.Embedding(11, 4)
        self.tgt_embed = self.src_embed
        self.generator = nn.Linear(4, 11, bias=False)
        self.generator.weight = self.src_embed.weight
        self.encoder_norm, self.hidden = nn.LayerNorm(4), nn.Linear(4, 4)
        self.decoder_norm = self.encoder_norm


def write_checkpoints(run: Path) -> None:
    """Three checkpoints of ``Tied`` (step 1 and 2 of one weights, step 3 of others) and the average of the last
    two, as a run and ``sanlab average`` write them."""
    manager = CheckpointManager(run, keep_best=0, keep_last=10, higher_is_better=True)
    for step, seed in ((1, 0), (2, 0), (3, 1)):
        manager.save(model=Tied(seed), state={"step": step}, meta={"step": step, "epoch": 1, "score": None})
    write_average([manager.dir / "step-00000002", manager.dir / "step-00000003"], run / "averaged")


def _weights(run: Path, name: str) -> Path:
    return run / ("averaged" if name == "averaged" else f"checkpoints/{name}") / WEIGHTS


def test_the_same_weights_are_the_same_bytes_at_every_save(tmp_path):
    run = tmp_path / "run"
    manager = CheckpointManager(run, keep_best=0, keep_last=10, higher_is_better=True)
    for step in range(1, 7):  # (six saves: their aliases came in one order in 1 of ~24^5 tries)
        manager.save(model=Tied(), state={"step": step}, meta={"step": step, "epoch": 1, "score": None})
    files = [_weights(run, f"step-{step:08d}") for step in range(1, 7)]
    assert len({f.read_bytes() for f in files}) == 1
    recorded = {json.loads((f.parent / META).read_text())["sha256"][WEIGHTS] for f in files}
    assert recorded == {file_sha256(files[0])}


@pytest.mark.slow  # two processes importing torch: ~2 s
def test_two_processes_write_the_same_bytes_for_the_same_weights(tmp_path):
    """Each process (of another PYTHONHASHSEED) writes the checkpoints and their average: file for file alike."""
    script = (f"import sys; from pathlib import Path; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
              "from test_checkpoint_bytes import write_checkpoints; write_checkpoints(Path(sys.argv[1]))")
    runs = [tmp_path / f"run{seed}" for seed in (1, 2)]
    procs = [subprocess.Popen([sys.executable, "-c", script, str(run)], stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}) for seed, run in zip((1, 2), runs)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    for name in ("step-00000001", "step-00000002", "step-00000003", "averaged"):
        a, b = (_weights(run, name) for run in runs)
        assert a.read_bytes() == b.read_bytes(), name
    assert _weights(runs[0], "step-00000001").read_bytes() == _weights(runs[0], "step-00000002").read_bytes()


def test_the_names_kept_of_tied_weights_are_those_save_model_kept_and_the_aliases_one_entry(tmp_path):
    """The name of each tied group stored is the one ``save_model`` stored (the first of the group by name), so that
    old and new files of a run hold the same names (averaging, reading a step-N); the others are recorded in one
    metadata entry, sorted (one entry has no order to vary)."""
    model = Tied()
    save_model(model, str(tmp_path / "before.safetensors"))
    CheckpointManager(tmp_path, keep_best=0, keep_last=1, higher_is_better=True).save(
        model=model, state={}, meta={"step": 1, "epoch": 1, "score": None})
    ours, before = _weights(tmp_path, "step-00000001"), tmp_path / "before.safetensors"
    kept, old = load_file(ours), load_file(before)
    assert sorted(kept) == sorted(old) == ["decoder_norm.bias", "decoder_norm.weight", "generator.weight",
                                           "hidden.bias", "hidden.weight"]
    assert all(torch.equal(kept[name], old[name]) and kept[name].is_contiguous() for name in kept)
    with safe_open(str(ours), "pt") as f, safe_open(str(before), "pt") as g:
        metadata, old_metadata = f.metadata(), g.metadata()
    assert metadata == {"aliases": json.dumps(old_metadata, sort_keys=True)}
    assert json.loads(metadata["aliases"]) == {
        "encoder_norm.bias": "decoder_norm.bias", "encoder_norm.weight": "decoder_norm.weight",
        "src_embed.weight": "generator.weight", "tgt_embed.weight": "generator.weight"}


def test_a_model_without_ties_has_a_file_without_metadata_as_before(tmp_path):
    model = nn.Sequential(nn.Linear(3, 2))
    save_model(model, str(tmp_path / "before.safetensors"))
    CheckpointManager(tmp_path, keep_best=0, keep_last=1, higher_is_better=True).save(
        model=model, state={}, meta={"step": 1, "epoch": 1, "score": None})
    assert _weights(tmp_path, "step-00000001").read_bytes() == (tmp_path / "before.safetensors").read_bytes()


@pytest.mark.parametrize("writer", ["save_model", "sanlab"])
def test_a_file_of_either_writer_loads_with_the_ties_intact(tmp_path, writer):
    """A checkpoint written by ``save_model`` (every checkpoint before) or now: every name of a tied group loads
    the stored tensor, and the group is still one tensor."""
    checkpoint = tmp_path / "checkpoints" / "step-00000001"
    if writer == "save_model":
        checkpoint.mkdir(parents=True)
        save_model(Tied(seed=1), str(checkpoint / WEIGHTS))  # (no meta.json: as written before checksums)
    else:
        CheckpointManager(tmp_path, keep_best=0, keep_last=1, higher_is_better=True).save(
            model=Tied(seed=1), state={}, meta={"step": 1, "epoch": 1, "score": None})
    model, stored = Tied(seed=0), load_file(checkpoint / WEIGHTS)
    load_weights(model, checkpoint)
    for name in ("src_embed", "tgt_embed", "generator"):
        assert torch.equal(getattr(model, name).weight, stored["generator.weight"]), name
    assert model.src_embed.weight is model.generator.weight is model.tgt_embed.weight
    assert model.encoder_norm is model.decoder_norm and torch.equal(model.hidden.weight, stored["hidden.weight"])


def test_a_checkpoint_written_before_and_one_written_now_average_together(tmp_path):
    """A run resumed across the change holds files of both writers: the same names, so ``sanlab average`` takes them."""
    old = tmp_path / "checkpoints" / "step-00000001"
    old.mkdir(parents=True)
    save_model(Tied(seed=0), str(old / WEIGHTS))
    (old / META).write_text(json.dumps({"step": 1, "epoch": 1, "score": None}))
    new = CheckpointManager(tmp_path, keep_best=0, keep_last=2, higher_is_better=True).save(
        model=Tied(seed=1), state={}, meta={"step": 2, "epoch": 1, "score": None})
    averaged = load_file(write_average([old, new], tmp_path / "averaged") / WEIGHTS)
    expected = (Tied(seed=0).generator.weight + Tied(seed=1).generator.weight) / 2
    assert sorted(averaged) == sorted(load_file(old / WEIGHTS))
    torch.testing.assert_close(averaged["generator.weight"], expected.detach())


def test_the_fallback_rule_keeps_the_names_safetensors_keeps(monkeypatch):
    """Should a safetensors release rename its private ``_remove_duplicate_names``, the module's own rule keeps the
    same names (those of every file written before), for the test model and a real translation model."""
    from safetensors.torch import _remove_duplicate_names

    from sanlab.training import weights_file
    from tests_helpers import tiny_seq2seq  # (here: the subprocesses of another test import this module)

    models = [Tied(), tiny_seq2seq(share_embeddings=True, tie_output=True)]
    expected = [weights_file.model_tensors(m) for m in models]
    assert all(weights_file._tied_groups(m.state_dict()) == dict(_remove_duplicate_names(m.state_dict()))
               for m in models)
    monkeypatch.setattr(weights_file, "_remove_duplicate_names", None)
    for model, (tensors, aliases) in zip(models, expected):
        fallback_tensors, fallback_aliases = weights_file.model_tensors(model)
        assert fallback_aliases == aliases and sorted(fallback_tensors) == sorted(tensors)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_weights_and_averages_get_the_permissions_of_a_new_file(tmp_path, umask):
    """safetensors writes its file 0600 whatever the umask, and mkdtemp makes averaged/ 0700: a colleague could read
    a checkpoint's state.pt but not its weights. Both follow the umask, as every other file of a run."""
    old = os.umask(umask)
    try:
        write_checkpoints(tmp_path / "run")
    finally:
        os.umask(old)
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000003"
    modes = {path.relative_to(tmp_path / "run").as_posix(): stat.S_IMODE(path.stat().st_mode)
             for path in (checkpoint, checkpoint / WEIGHTS, checkpoint / META, tmp_path / "run" / "averaged",
                          tmp_path / "run" / "averaged" / WEIGHTS, tmp_path / "run" / "averaged" / META)}
    files, directories = 0o666 & ~umask, 0o777 & ~umask
    assert modes == {name: directories if name.endswith(("step-00000003", "averaged")) else files for name in modes}
