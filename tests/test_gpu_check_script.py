"""scripts/gpu_check.sh around its steps: it refuses at once, before anything runs on the device, when a step needs
the Multi30k files and they are not where GPU_DATA says (the device tool carries only the checkout: a missing data
folder used to surface minutes later, or as a self-referencing link under ../shared), and a failed step makes the
call fail, named in the report."""

import os
import sys
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bare_copy(tmp_path) -> Path:
    """The script in a tree of its own (no carried wheels: the checkout may hold some)."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "gpu_check.sh").write_text((ROOT / "scripts" / "gpu_check.sh").read_text())
    return repo


@pytest.mark.parametrize("steps", ["table1", "decode-agreement", "env,train"])
def test_a_step_that_needs_the_data_stops_before_it_starts(tmp_path, steps):
    env = {**os.environ, "GPU_STEPS": steps, "GPU_DATA": str(tmp_path / "nowhere"), "REPORT_DIR": str(tmp_path / "r"),
           "GPU_DEVICE": "cpu"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert f"needs the Multi30k files in {tmp_path / 'nowhere'}" in done.stderr and "carry that folder" in done.stderr
    assert not (tmp_path / "r" / "gpu.md").exists()  # no step began


def test_table1_stops_when_the_sentencepiece_would_train_another_vocabulary(tmp_path):
    """The H200 image's sentencepiece 0.2.2 trained another subword vocabulary than the grid's cells (0.2.3):
    the table1 step now compares versions before it trains anything. Run from a copy of the script in a bare
    tree (no carried wheels), with a stand-in sentencepiece module of another version."""
    repo = _bare_copy(tmp_path)
    cell = repo / "results" / "compare" / "csan-table1-multi30k" / "vanilla" / "seed-1"
    cell.mkdir(parents=True)
    (cell / "meta.json").write_text('{"versions": {"sentencepiece": "0.2.3"}}')
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en.gz").write_bytes(b"")
    fake = tmp_path / "fake" / "sentencepiece"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "0.2.2"\n')
    env = {**os.environ, "GPU_STEPS": "table1", "GPU_DATA": str(data), "REPORT_DIR": str(tmp_path / "r"),
           "GPU_DEVICE": "cpu", "PYTHON": sys.executable, "PYTHONPATH": str(fake.parent)}
    done = subprocess.run(["bash", str(repo / "scripts" / "gpu_check.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "sentencepiece 0.2.2 here, but the grid's cells used 0.2.3" in done.stdout
    assert not list(cell.parent.parent.glob("*/seed-*/config.yaml"))  # nothing trained


@pytest.mark.parametrize("works", [True, False])
def test_a_failed_step_is_named_and_the_call_exits_1(tmp_path, works):
    """A failed `pytest -m gpu` used to leave the call's status 0: whoever ran it on a lease saw success."""
    python = sys.executable
    if not works:
        python = tmp_path / "broken-python"
        python.write_text("#!/bin/sh\necho 'no torch here' >&2\nexit 3\n")
        python.chmod(0o755)
    repo = _bare_copy(tmp_path)
    env = {**os.environ, "GPU_STEPS": "env", "REPORT_DIR": str(tmp_path / "r"), "GPU_DEVICE": "cpu",
           "PYTHON": str(python)}
    done = subprocess.run(["bash", str(repo / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=120)
    report = (tmp_path / "r" / "gpu.md").read_text()
    if works:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Failed" not in report and "torch" in report  # sanlab env's lines
    else:
        assert done.returncode == 1 and "Failed: env (exit 3)" in report and "no torch here" in report


def _recording_python(tmp_path, *, status: int = 0) -> Path:
    """A stand-in python that writes its arguments (one call a line) to calls.log and exits with ``status``."""
    python = tmp_path / "recording-python"
    python.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/calls.log"\nexit {status}\n')
    python.chmod(0o755)
    return python


def _data(tmp_path) -> Path:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "train.en.gz").write_bytes(b"")
    return data


@pytest.mark.parametrize("rounds", [None, "2"])
def test_decode_agreement_is_timed_in_rounds(tmp_path, rounds):
    """The agreement step passes --rounds (GPU_AGREEMENT_ROUNDS, default 3): the two precisions alternate in
    running first, and the report gives the median of the rounds."""
    repo = _bare_copy(tmp_path)
    env = {**os.environ, "GPU_STEPS": "decode-agreement", "GPU_DATA": str(_data(tmp_path)),
           "REPORT_DIR": str(tmp_path / "r"), "GPU_DEVICE": "cpu", "DECODE_RUN": "runs/trained",
           "PYTHON": str(_recording_python(tmp_path))}
    if rounds:
        env["GPU_AGREEMENT_ROUNDS"] = rounds
    done = subprocess.run(["bash", str(repo / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    [call] = (tmp_path / "calls.log").read_text().splitlines()
    assert call.startswith("scripts/decode_agreement.py --run runs/trained ")
    assert f"--rounds {rounds or 3} " in call
