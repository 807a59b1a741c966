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


def _probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "probe_misuse.py"), *args], capture_output=True,
                          text=True, timeout=300)


def test_list_names_the_checks():
    names = _probe("--list").stdout.split()
    assert len(names) >= 18 and "run_below_a_file" in names and "huge_learning_rate" in names


@pytest.mark.slow  # a sanlab train and two more processes
def test_only_runs_the_checks_named():
    done = _probe("--only", "run_below_a_file", "--only", "huge_learning_rate")
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[-1] == "2 of 2 as expected", done.stdout + done.stderr
    assert [line.split()[0] for line in lines[:-1]] == ["ok", "ok"]
    assert "--run lr" in lines[0] and "--run afile.txt/sub" in lines[1]  # in the checks' own order


def test_an_unknown_check_is_refused_with_the_known_ones():
    done = _probe("--only", "run_dot", "--only", "no_such_check")
    assert done.returncode == 2 and done.stdout == ""
    assert "no check named 'no_such_check'; the checks are: overwrite_other, run_dot," in done.stderr
