"""scripts/gpu_check.sh refuses at once, before anything runs on the device, when a step needs the Multi30k
files and they are not where GPU_DATA says (the device tool carries only the checkout: a missing data folder
used to surface minutes later, or as a self-referencing link under ../shared)."""

import os
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
