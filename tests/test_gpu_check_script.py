"""scripts/gpu_check.sh refuses at once, before anything runs on the device, when a step needs the Multi30k
files and they are not where GPU_DATA says (the device tool carries only the checkout: a missing data folder
used to surface minutes later, or as a self-referencing link under ../shared)."""

import os
import sys
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "gpu_check.sh").write_text((ROOT / "scripts" / "gpu_check.sh").read_text())
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
