"""SIGKILL at random points of a small run, then the same command again: the run ends with the uninterrupted
run's weights, bit for bit, and logs each update once (issue 27). The in-process crash tests of
test_resume.py stop at chosen places; a real kill may land anywhere, a checkpoint write included."""

import json
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from sanlab.config import dump_config
from sanlab.runs import train_run
from training_fixtures import final_weights

SETTINGS = dict(max_steps=12, valid_every=3, log_every=1, threads=1)


def _train_steps(run):
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # the line being written
            pass
    return [r["step"] for r in records if r["split"] == "train"]


def _kill_after(recipe, run, *, step, delay):
    """Start `sanlab train`, SIGKILL it ``delay`` seconds after it logged update ``step``. Returns False if it
    finished first."""
    process = subprocess.Popen([sys.executable, "-m", "sanlab", "train", str(recipe), "--run", str(run), "--quiet"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while process.poll() is None and max(_train_steps(run), default=0) < step and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    killed = process.poll() is None
    process.send_signal(signal.SIGKILL)
    process.wait()
    return killed


@pytest.mark.slow  # three processes that import torch and train: ~30 s
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sigkill_at_a_random_point_then_rerun_ends_bit_identical(tmp_path, tiny_translation, seed):
    config = tiny_translation(**SETTINGS)
    straight = tmp_path / "straight"
    train_run(config, straight, quiet=True)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(dump_config(config))
    rng = random.Random(seed)
    run = tmp_path / "killed"
    # an update, a validation or a checkpoint write of updates 1-10 (validations at 3, 6, 9) is cut off
    assert _kill_after(recipe, run, step=rng.randint(1, SETTINGS["max_steps"] - 3), delay=rng.uniform(0, 0.15)), \
        "the run finished before it was killed"
    train_run(config, run, quiet=True)
    a, b = final_weights(straight), final_weights(run)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    assert _train_steps(run) == _train_steps(straight) == list(range(1, SETTINGS["max_steps"] + 1))
