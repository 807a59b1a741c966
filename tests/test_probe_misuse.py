"""scripts/probe_misuse.py replays every command line of issue 27; each must give a clear error or the right
result (run by `make test`; it trains a dozen tiny runs and starts one sanlab process)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~40 s on an idle 2-core machine
def test_every_command_line_of_the_issue_gives_a_message_or_the_right_result():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "probe_misuse.py")], capture_output=True, text=True,
                          timeout=600)
    lines = done.stdout.splitlines()
    assert [line for line in lines if not line.startswith("ok  ")][:-1] == [], done.stdout + done.stderr
    total = re.fullmatch(r"(\d+) of (\d+) as expected", lines[-1])
    assert total and total[1] == total[2] and int(total[1]) >= 18 and done.returncode == 0, done.stdout
