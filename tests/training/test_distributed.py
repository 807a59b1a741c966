"""Data-parallel training (torchrun + DDP, gloo): two processes train what one process accumulating the
same batches trains, and an interrupted two-process run resumes to the uninterrupted parameters."""

import pytest
import torch

from sanlab.cli import main
from sanlab.config import dump_config

from training_fixtures import final_weights

pytestmark = pytest.mark.slow  # each launch starts two Python processes (~10 s)


def _train(tmp_path, tiny_translation, run, *, nproc, **train):
    config = tmp_path / f"{run}.yaml"
    config.write_text(dump_config(tiny_translation(**train)))
    assert main(["train", str(config), "--run", str(tmp_path / run), "--nproc", str(nproc), "--quiet"]) == 0
    return final_weights(tmp_path / run)


def _no_dropout(tiny_translation):
    def make(**train):
        config = tiny_translation(**train)
        return config.model_copy(update={"model": config.model.model_copy(update={"dropout": 0.0})})
    return make


def test_two_processes_train_what_one_process_accumulating_their_batches_trains(tmp_path, tiny_translation):
    make = _no_dropout(tiny_translation)  # dropout streams differ per process by design
    # Adam's eps = 1 makes the update about linear in small gradients: with the default 1e-9 Adam cancels
    # any constant factor, so gradients summed wrongly over processes (halved) would still pass
    two = _train(tmp_path, make, "two", nproc=2, max_steps=5, valid_every=5, eps=1.0)
    one = _train(tmp_path, make, "one", nproc=1, max_steps=5, valid_every=5, accum_steps=2, eps=1.0)
    assert two.keys() == one.keys()
    moved = _train(tmp_path, make, "start", nproc=1, max_steps=0, valid_every=5, eps=1.0)
    for name in one:  # same update up to the order of the floating-point sums
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-6, msg=name)
    assert any(not torch.equal(one[n], moved[n]) for n in one)  # and training did change the weights


def test_an_interrupted_two_process_run_resumes_to_the_uninterrupted_parameters(tmp_path, tiny_translation):
    straight = _train(tmp_path, tiny_translation, "straight", nproc=2, max_steps=6, valid_every=3)
    _train(tmp_path, tiny_translation, "resumed", nproc=2, max_steps=3, valid_every=3)
    resumed = _train(tmp_path, tiny_translation, "resumed", nproc=2, max_steps=6, valid_every=3)
    for name in straight:  # dropout on: every process's RNG stream was restored
        torch.testing.assert_close(resumed[name], straight[name], rtol=0, atol=0, msg=name)
    log = (tmp_path / "resumed" / "train.log").read_text()
    assert "2 processes" in log and "resumed from" in log and "WARNING" not in log
    _train(tmp_path, tiny_translation, "resumed", nproc=1, max_steps=7, valid_every=3)  # legal, but not silent
    log = (tmp_path / "resumed" / "train.log").read_text()
    assert "WARNING: the checkpoint was written by 2 process(es) and this run has 1" in log


def test_parameters_without_gradient_get_a_clear_error_naming_them(tmp_path, tiny_translation, capfd):
    (tmp_path / "tiny.yaml").write_text(dump_config(tiny_translation(max_steps=3, valid_every=3)))
    config = tmp_path / "muse.yaml"  # MUSE's decoder builds a LayerNorm it never calls (parameter parity)
    config.write_text("base: tiny.yaml\nmodel:\n  decoder:\n"
                      "    mixer: {type: muse, kernel_sizes: [3, 5], unused_cross_norm: true}\n")
    assert main(["train", str(config), "--run", str(tmp_path / "muse"), "--nproc", "2", "--quiet"]) != 0
    err = capfd.readouterr().err
    assert "--set train.find_unused_parameters=true" in err and "reference_only.weight" in err
