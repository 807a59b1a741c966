"""scripts/gpu_check.sh around its steps: it refuses at once, before anything runs on the device, when a step needs
the Multi30k files and they are not where GPU_DATA says (the device tool carries only the checkout: a missing data
folder used to surface minutes later, or as a self-referencing link under ../shared), and a failed step makes the
call fail, named in the report. What runs without a GPU: the exit statuses (0, 1, 2), the arguments the steps pass
(with stand-in pythons), timeouts, and the table1 loop's cells, failures and dev decodes."""

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
    assert "sentencepiece 0.2.2 here, but the grid's cells used 0.2.3" in done.stderr
    assert not list(cell.parent.parent.glob("*/seed-*/config.yaml"))  # nothing trained
    env["GPU_STEPS"] = "env,table1"  # checked before any step: exit 2 says that nothing ran (env had run before)
    done = subprocess.run(["bash", str(repo / "scripts" / "gpu_check.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "nothing ran" in done.stderr and not (tmp_path / "r" / "gpu.md").exists()


def test_all_beside_other_steps_still_means_every_step(tmp_path):
    """GPU_STEPS=all,table1 passed the check of names but ran table1 alone: `all` counted only alone."""
    repo = _bare_copy(tmp_path)
    done = _gpu_check(repo, tmp_path, GPU_STEPS="all,gpubench", PYTHON=str(_recording_python(tmp_path)),
                      GPU_DATA=str(_data(tmp_path)), GPU_TEST_TIMEOUT="5", TRAIN_MINUTES="1")
    report = (tmp_path / "r" / "gpu.md").read_text()
    assert "## sanlab env" in report and "## pytest -m gpu" in report, done.stdout + done.stderr


@pytest.mark.parametrize("works", [pytest.param(True, marks=pytest.mark.slow),  # sanlab env: imports torch
                                   False])
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


def _gpu_check(repo: Path, tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(repo / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "REPORT_DIR": str(tmp_path / "r"), "GPU_DEVICE": "cpu",
                                            **env})


@pytest.mark.parametrize("env, said", [
    ({"GPU_STEPS": "env,tets"}, "GPU_STEPS: no step named 'tets'; the steps: all env tests bench"),
    ({"GPU_STEPS": "train", "TRAIN_MINUTES": "0"}, "TRAIN_MINUTES must be a whole number of minutes above 0, not '0'"),
    ({"GPU_STEPS": "env", "TABLE1_MINUTES": "1.5"}, "TABLE1_MINUTES must be a whole number of minutes above 0"),
    # a leading zero: bash arithmetic reads 08 as octal, and stop_after ended in an error
    ({"GPU_STEPS": "env", "STOP_MARGIN": "08"}, "STOP_MARGIN must be a whole number of seconds without a leading "
                                                "zero, not '08'"),
])
def test_a_usage_error_exits_2_before_anything_runs(tmp_path, env, said):
    """A misspelt step ran nothing and exited 0; TRAIN_MINUTES=0 was `timeout 0`, which is no limit at all."""
    repo = _bare_copy(tmp_path)
    done = _gpu_check(repo, tmp_path, PYTHON=str(_recording_python(tmp_path)), **env)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert not (tmp_path / "calls.log").exists() and not (tmp_path / "r" / "gpu.md").exists()


@pytest.mark.parametrize("compile_, deterministic, expected", [
    (None, None, "--compile vanilla 1D-CSAN --deterministic vanilla Rel_Pos --out"),
    ("", "", "--precision bf16 --out"),  # set empty: no compiled row, none under deterministic algorithms
    ("Block", "", "--precision bf16 --compile Block --out"),
])
def test_the_gpu_bench_compiles_what_gpu_compile_names(tmp_path, compile_, deterministic, expected):
    """GPU_COMPILE= (empty) gave the default list again (`:-`), so compiled rows could not be left out."""
    repo = _bare_copy(tmp_path)
    env = {"GPU_STEPS": "gpubench", "PYTHON": str(_recording_python(tmp_path))}
    env.update({k: v for k, v in (("GPU_COMPILE", compile_), ("GPU_DETERMINISTIC", deterministic)) if v is not None})
    done = _gpu_check(repo, tmp_path, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    [call] = (tmp_path / "calls.log").read_text().splitlines()
    assert call.startswith("bench/gpu.py configs/compare/csan-table1-wmt14.yaml") and expected in call, call


def test_the_env_steps_timeout_is_overridable_and_a_timeout_fails_the_call(tmp_path):
    python = tmp_path / "slow-python"
    python.write_text("#!/bin/sh\nsleep 30\n")
    python.chmod(0o755)
    repo = _bare_copy(tmp_path)
    done = _gpu_check(repo, tmp_path, GPU_STEPS="env", PYTHON=str(python), GPU_ENV_TIMEOUT="1")
    assert done.returncode == 1 and "Failed: env (exit 124)" in (tmp_path / "r" / "gpu.md").read_text()


def _table1_python(tmp_path, *, cell_status: int, evaluate_status: int = 0, cut: bool = False) -> Path:
    """A stand-in python for the table1 step: lists two pending cells, says the grid's sentencepiece version,
    'trains' a cell by reading its standard input, scoring it (its compare-eval.json) and exiting with
    ``cell_status``, and decodes a cell's dev set: Block's (waited for first) in a second, with success; vanilla's
    at once, exiting with ``evaluate_status``. ``cut``: compare's --stop-after cuts each cell instead (exit 0, no
    score): vanilla stopped at an update, Block not begun, each said on stderr before a 25-line table."""
    python = tmp_path / "table1-python"
    cut_cells = """
  *"--only vanilla"*) cat > /dev/null
             echo "[1/1] vanilla seed 1: trained: stopped at update 1,200 of 100,000 by --stop-after 3m; resumable \\
(3m 0s)" >&2; seq 25 | sed 's/.*/| table row & |/' ;;
  *"--only Block"*) cat > /dev/null
             echo "[1/1] Block seed 1: not begun: past --stop-after 3m (0s)" >&2; seq 25 | sed 's/.*/| table row & |/' ;;"""
    python.write_text(f"""#!/bin/bash
echo "$*" >> "{tmp_path}/calls.log"
case "$*" in
  "- "*" start") printf 'vanilla\\t1\\nBlock\\t1\\n' ;;
  "-c "*) echo 0.2.3 ;;{cut_cells if cut else ""}
  *"--only"*) cat > /dev/null; all="$*" only="${{all#*--only }}"; cell=results/compare/csan-table1-multi30k/${{only%% *}}/seed-1
             mkdir -p $cell
             echo '{{}}' > $cell/compare-eval.json; echo "cell done"; exit {cell_status} ;;
  *" evaluate "*"/Block/"*) sleep 1; exit 0 ;;
  *" evaluate "*) exit {evaluate_status} ;;
esac
exit 0
""")
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("cell_status", [0, 3])
def test_a_failed_table1_cell_fails_the_call_and_no_cell_eats_the_list(tmp_path, cell_status):
    """The cells were trained in a `... | while read` loop: a command reading its standard input took the rest of
    the list (one cell trained, the others never), and a failure recorded in the loop's subshell was lost: the
    call exited 0."""
    repo = _bare_copy(tmp_path)
    done = _gpu_check(repo, tmp_path, GPU_STEPS="table1", GPU_DATA=str(_data(tmp_path)),
                      PYTHON=str(_table1_python(tmp_path, cell_status=cell_status)))
    calls = (tmp_path / "calls.log").read_text().splitlines()
    trained = [c.split("--only ")[1] for c in calls if "--only" in c]
    assert trained == ["vanilla --seed 1", "Block --seed 1"], calls
    report = (tmp_path / "r" / "gpu.md").read_text()
    if cell_status == 0:
        assert done.returncode == 0 and "Failed" not in report, done.stdout + done.stderr
    else:
        assert done.returncode == 1, done.stdout + done.stderr
        assert "table1: vanilla seed 1 failed (exit 3)" in report and "Failed: table1 (a cell) (exit 1)" in report


@pytest.mark.parametrize("table1_args", [None, "--only vanilla --seed 1 --set train.threads=2"])
def test_a_table1_cell_cut_by_stop_after_is_named_in_the_report(tmp_path, table1_args):
    """compare exits 0 when --stop-after cuts a cell (resumable, not failed), and the step kept only the last lines
    of its output, the table: the stderr line saying the cell was stopped or not begun was dropped, so the report
    said nothing of the cut. Both forms of the step: the loop over the grid's cells, and TABLE1_ARGS."""
    repo = _bare_copy(tmp_path)
    env = dict(GPU_STEPS="table1", GPU_DATA=str(_data(tmp_path)),
               PYTHON=str(_table1_python(tmp_path, cell_status=0, cut=True)))
    if table1_args:
        env["TABLE1_ARGS"] = table1_args
    done = _gpu_check(repo, tmp_path, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    report = (tmp_path / "r" / "gpu.md").read_text()
    assert ("[1/1] vanilla seed 1: trained: stopped at update 1,200 of 100,000 by --stop-after 3m; resumable"
            in report), report
    assert ("[1/1] Block seed 1: not begun: past --stop-after 3m" in report) == (table1_args is None), report
    assert "| table row 25 |" in report and "Failed" not in report  # the table still ends it; not a failure


def test_a_failed_dev_decode_of_a_table1_cell_fails_the_call(tmp_path):
    """The dev decodes run side by side, and a bare `wait` said 0 whatever they said: each is waited for by its
    pid now, the pid of a group. A bare `a | tail &` that had ended before its `wait` said tail's 0 (vanilla's
    failed decode, while Block's was waited for) when bash 5.2 ran the script as `bash -c "TEXT"`, as the device
    tool's command line does, and not when it ran the file: so the script runs here as `bash -c` (its path as $0,
    for its `cd`), where that form fails this test."""
    repo = _bare_copy(tmp_path)
    script = repo / "scripts" / "gpu_check.sh"
    done = subprocess.run(["bash", "-c", script.read_text(), str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "REPORT_DIR": str(tmp_path / "r"), "GPU_DEVICE": "cpu",
                                            "GPU_STEPS": "table1", "GPU_DATA": str(_data(tmp_path)),
                                            "PYTHON": str(_table1_python(tmp_path, cell_status=0,
                                                                         evaluate_status=4))})
    report = (tmp_path / "r" / "gpu.md").read_text()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the dev decode of results/compare/csan-table1-multi30k/vanilla/seed-1 failed (exit 4)" in report
    assert "Failed: table1 (dev decodes) (exit 1)" in report and (tmp_path / "r" / "table1-cells.tar.gz").exists()


class _Parsed(BaseException):
    """Raised by a parser once it has read a command line: the command is stopped before it does anything."""


@pytest.mark.slow  # (imports every bench script)
def test_every_command_of_the_planned_calls_names_existing_scripts_options_and_tests(tmp_path, monkeypatch):
    """The stand-in pythons above see the arguments, never whether the scripts still take them: a bench option
    renamed since the last lease would fail there after the machine's minutes were spent. Every command of the
    planned calls (the header's two, and table1) is recorded, then read by the real parsers (nothing runs), the
    tests pytest is given exist, and the variants the gpubench names are the grid's."""
    import argparse
    import runpy

    from sanlab.cli import _parser
    from sanlab.experiments.grid import load_grid

    repo = _bare_copy(tmp_path)
    (repo / "runs" / "gpu-multi30k").mkdir(parents=True)  # a finished run: its evaluation and agreement follow
    (repo / "runs" / "gpu-multi30k" / "train.log").write_text("finished at step 3000, epoch 23\n")
    python = _recording_python(tmp_path)
    calls = [dict(GPU_STEPS="train,decode-agreement", TRAIN_MINUTES="4", GPU_AGREEMENT_ROUNDS="2"),
             dict(GPU_STEPS="env,tests", GPU_TEST_WORKERS="8", GPU_TEST_TIMEOUT="240"),
             dict(GPU_STEPS="gpubench,blocklayer,window,trainstep,decode", GPU_BENCH_TIMEOUT="260",
                  GPU_BLOCK_TIMEOUT="45", GPU_WINDOW_REPEATS="5",
                  GPU_BENCH_ARGS="--rounds 2 --updates 5 --warmup 2 --profile-updates 2"),
             dict(GPU_STEPS="table1", TABLE1_ARGS="--only Block --seed 1 --jobs 3 --set train.threads=2")]
    for env in calls:
        done = _gpu_check(repo, tmp_path, PYTHON=str(python), GPU_DATA=str(_data(tmp_path)), **env)
        assert done.returncode == 0, done.stdout + done.stderr
    commands = [line.split() for line in (tmp_path / "calls.log").read_text().splitlines()]
    commands = [c for c in commands if c[0] not in ("-", "-c")]  # the script's own snippets
    train = next(c for c in commands if c[:3] == ["-m", "sanlab", "train"])
    assert train[train.index("--stop-after") + 1] == "195s"  # TRAIN_MINUTES=4 less STOP_MARGIN's 45 s
    assert [c for c in commands if c[:3] == ["-m", "sanlab", "compare"] and "--table-only" not in c  # table1's
            and "--stop-after" not in c] == []
    real_parse = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise _Parsed(real_parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    seen = set()
    for command in commands:
        if command[:2] == ["-m", "sanlab"]:
            with pytest.raises(_Parsed):
                _parser().parse_args(command[2:])
            seen.add(f"sanlab {command[2]}")
        elif command[:2] == ["-m", "pytest"]:
            paths = [a for a in command[2:] if not a.startswith("-") and a not in ("gpu", "no:cacheprovider", "8")]
            assert paths and all((ROOT / p).exists() for p in paths), command
            seen.add("pytest")
        else:
            script, *args = command
            assert (ROOT / script).is_file(), command
            monkeypatch.setattr(sys, "argv", [script, *args])
            with pytest.raises(_Parsed) as parsed:
                runpy.run_path(str(ROOT / script), run_name="__main__")
            seen.add(script)
            if script == "bench/gpu.py":
                variants = {cell.variant for cell in load_grid(ROOT / parsed.value.args[0].grid).cells}
                named = set(parsed.value.args[0].compile) | set(parsed.value.args[0].deterministic)
                assert named and named <= variants, named - variants
    assert seen == {"sanlab env", "sanlab train", "sanlab evaluate", "sanlab compare", "pytest", "bench/gpu.py",
                    "bench/block_layer.py", "bench/attention_window.py", "bench/train_step.py",
                    "bench/decode_speed.py", "scripts/decode_agreement.py"}, seen
