"""Replay the command lines of issue 27 ("Nothing lost, whatever the user types") on tiny synthetic data in a
temporary directory; print one line per command: ``ok`` or ``FAIL``, the command, and what sanlab said.

    python scripts/probe_misuse.py          # exit status 1 if any line is FAIL
    python scripts/probe_misuse.py --list   # the checks' names
    python scripts/probe_misuse.py --only run_dot --only huge_learning_rate   # these checks alone

Each command must give a clear one-line error (exit status 2, no traceback) or the right result, and leave
everything outside a sanlab run directory as it was. `tests/test_probe_misuse.py` runs it (`make test`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from sanlab.cli import main as sanlab_main

WORDS = "a b c d e f g h i j k l".split()
CHECKS: list[Callable[["Workspace"], tuple[bool, str, str]]] = []


def check(fn):
    CHECKS.append(fn)
    return fn


class Workspace:
    """A temporary directory with a reverse-the-words corpus and a tiny translation recipe, ``mt.yaml``."""

    def __init__(self, root: Path):
        self.root = root
        self.data = root / "data"
        self.data.mkdir()
        rng = random.Random(0)
        for split, size in (("train", 120), ("valid", 10)):
            src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(size)]
            (self.data / f"{split}.src").write_text("".join(s + "\n" for s in src))
            (self.data / f"{split}.tgt").write_text("".join(" ".join(reversed(s.split())) + "\n" for s in src))
        self.recipe("mt.yaml")

    def raw(self, **train) -> dict:
        d = self.data
        return {"task": "translation",
                "data": {"train": {"src": str(d / "train.src"), "tgt": str(d / "train.tgt")},
                         "valid": {"src": str(d / "valid.src"), "tgt": str(d / "valid.tgt")}, "subword": {"vocab_size": 30}},
                "model": {"dim": 16, "encoder": {"layers": 1, "ffn_dim": 32, "attention": {"heads": 2}},
                          "decoder": {"layers": 1, "ffn_dim": 32, "attention": {"heads": 2}}},
                "train": {"max_steps": 2, "valid_every": 1, "max_tokens": 200, "warmup_steps": 2, "progress": False,
                          "threads": 1, **train},
                "decode": {"beam": 2, "max_len_b": 3}}

    def recipe(self, name: str, raw: dict | None = None, *, where: Path | None = None) -> Path:
        path = (where or self.root) / name
        path.write_text(yaml.safe_dump(raw or self.raw(), sort_keys=False))
        return path

    def sanlab(self, *argv: str, cwd: Path | None = None) -> tuple[int, str]:
        """``sanlab ARGV`` in this process (from ``cwd``); its exit status and what it printed to stderr."""
        err, here = io.StringIO(), os.getcwd()
        os.chdir(cwd or self.root)
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code = sanlab_main(list(argv))
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
        finally:
            os.chdir(here)
        return code, err.getvalue().strip()

    def base(self) -> Path:
        """A trained run with two checkpoints, shared by the checks that only read it."""
        return self.root / "base" if (self.root / "base").exists() else self.trained("base")

    def trained(self, name: str, *sets: str) -> Path:
        code, said = self.sanlab("train", "mt.yaml", "--run", name, "--quiet", *sets)
        if code != 0:
            raise RuntimeError(f"training {name} failed: {said}")
        return self.root / name


def _refused(code: int, said: str, *expected: str) -> bool:
    """A clear refusal: status 2, no traceback, the error on its `sanlab ...: error:` line (after the log lines of
    a run, if it started), naming what is expected."""
    error = said[said.find("sanlab "):] if "sanlab " in said else ""
    return code == 2 and error and "Traceback" not in said and all(text in error for text in expected)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


# ------------------------------------------------------------------------------------------ 1. data loss
@check
def overwrite_other(ws):
    other = ws.root / "other"
    (other / "src").mkdir(parents=True)
    (other / "config.yaml").write_text("foo: bar\n")
    (other / "src" / "main.py").write_text("print(1)\n")
    (other / "README").write_text("notes\n")
    before = _files(other)
    code, said = ws.sanlab("train", "mt.yaml", "--run", "other", "--overwrite")
    return (_refused(code, said, "README, config.yaml, src") and _files(other) == before,
            "sanlab train mt.yaml --run other --overwrite", said)


def _project(ws) -> tuple[Path, dict]:
    project = ws.root / "project"
    if not project.exists():
        project.mkdir()
        shutil.copytree(ws.data, project / "data")
        ws.recipe("exp.yaml", where=project)
    return project, _files(project)


@check
def run_dot(ws):
    project, before = _project(ws)
    code, said = ws.sanlab("train", "exp.yaml", "--run", ".", cwd=project)
    return (_refused(code, said, "current directory") and _files(project) == before and not (project / ".lock").exists(),
            "(in a project) sanlab train exp.yaml --run .", said)


@check
def run_dot_overwrite(ws):
    project, before = _project(ws)
    code, said = ws.sanlab("train", "exp.yaml", "--run", ".", "--overwrite", cwd=project)
    return (_refused(code, said, "current directory") and _files(project) == before,
            "(in a project) sanlab train exp.yaml --run . --overwrite", said)


@check
def recipe_named_config_yaml(ws):
    mine = ws.root / "mine"
    mine.mkdir()
    recipe = ws.recipe("config.yaml", where=mine)
    text = recipe.read_text()
    code, said = ws.sanlab("train", "config.yaml", "--run", ".", cwd=mine)
    return (_refused(code, said, "current directory") and recipe.read_text() == text,
            "(beside it) sanlab train config.yaml --run .", said)


# ------------------------------------------------------------------------------------- 2. changed data
@check
def changed_data(ws):
    run = ws.trained("changed")
    for side in ("src", "tgt"):  # other sentences at the same paths
        path = ws.data / f"train.{side}"
        path.write_text(path.read_text().replace("a", "b"))
    code, said = ws.sanlab("train", "mt.yaml", "--run", "changed", "--set", "train.max_steps=3", "--quiet")
    allowed, _ = ws.sanlab("train", "mt.yaml", "--run", "changed", "--set", "train.max_steps=3", "--quiet",
                           "--allow-changed-data")
    ok = _refused(code, said, "train.src", "changed since this run last trained") and allowed == 0
    return ok and "--allow-changed-data" in (run / "train.log").read_text(), \
        "(new training files at the same paths) sanlab train mt.yaml --run changed", said


# ------------------------------------------------------------------------------- 3. damaged checkpoint
@check
def damaged_checkpoint(ws):
    run = ws.trained("damaged")
    weights = run / "checkpoints" / "step-00000002" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = b"\xff" * 64  # the header stays intact
    weights.write_bytes(bytes(data))
    code, said = ws.sanlab("translate", "--run", "damaged", "--checkpoint", "last", "--input", str(ws.data / "valid.src"))
    resumed, _ = ws.sanlab("train", "mt.yaml", "--run", "damaged", "--set", "train.max_steps=3", "--quiet")
    log = (run / "train.log").read_text()
    ok = _refused(code, said, "sha256 differs") and resumed == 0 and "skipping a damaged checkpoint" in log
    return ok and "(step 1," in log.split("resumed from")[-1], \
        "(0xff over model.safetensors' tensors) sanlab translate --checkpoint last; sanlab train (resume)", said


# ----------------------------------------------------------------------------------- 4. tracebacks
@check
def missing_state(ws):
    run = ws.trained("nostate", "--set", "train.max_steps=1")
    (run / "checkpoints" / "step-00000001" / "state.pt").unlink()
    code, said = ws.sanlab("train", "mt.yaml", "--run", "nostate", "--set", "train.max_steps=2")
    return _refused(code, said, "state.pt: missing"), "(state.pt deleted) sanlab train mt.yaml --run nostate", said


@check
def huge_learning_rate(ws):
    code, said = ws.sanlab("train", "mt.yaml", "--run", "lr", "--set", "train.lr=1e39", "--quiet")
    return _refused(code, said, "overflows float32"), "sanlab train mt.yaml --run lr --set train.lr=1e39", said


@check
def run_below_a_file(ws):
    (ws.root / "afile.txt").write_text("x\n")
    code, said = ws.sanlab("train", "mt.yaml", "--run", "afile.txt/sub")
    return _refused(code, said, "is a file, not a directory"), "sanlab train mt.yaml --run afile.txt/sub", said


@check
def translate_into_head(ws):
    ws.base()
    sentences = ws.root / "many.src"
    sentences.write_text("a b c\n" * 3000)  # more output than a pipe holds: head has exited when it is written
    shell = (f"{sys.executable} -m sanlab translate --run base --checkpoint last --n-best 2 --input {sentences} "
             "| head -n 1")
    done = subprocess.run(["bash", "-o", "pipefail", "-c", shell], cwd=ws.root, capture_output=True, text=True)
    ok = done.stdout.startswith("0 ||| ") and done.stdout.count("\n") == 1 and "Traceback" not in done.stderr
    return ok, "sanlab translate --run base --n-best 2 ... | head -n 1", \
        f"exit {done.returncode}, {done.stdout.count(chr(10))} line(s), stderr {done.stderr.strip()[:80]!r}"


# ----------------------------------------------------------------------- 5. late or misleading messages
def _with_test(ws, name: str, src_lines: str, tgt_lines: str | None) -> Path:
    (ws.data / f"{name}.src").write_text(src_lines)
    if tgt_lines is not None:
        (ws.data / f"{name}.tgt").write_text(tgt_lines)
    raw = ws.raw()
    raw["data"]["test"] = {"t": {"src": str(ws.data / f"{name}.src"), "tgt": str(ws.data / f"{name}.tgt")}}
    return ws.recipe(f"{name}.yaml", raw)


@check
def test_file_missing(ws):
    _with_test(ws, "nosuchtest", "a b\n", None)
    code, said = ws.sanlab("train", "nosuchtest.yaml", "--run", "t1")
    evaluate, said_later = ws.sanlab("evaluate", "--run", "t1")
    ok = _refused(code, said, "nosuchtest.tgt: file not found") and not (ws.root / "t1").exists()
    return ok and _refused(evaluate, said_later, "not a run directory"), \
        "(test file missing) sanlab train; sanlab evaluate", said


@check
def test_file_misaligned(ws):
    _with_test(ws, "shorttest", "a b\nc d\n", "b a\n")
    code, said = ws.sanlab("train", "shorttest.yaml", "--run", "t2")
    return _refused(code, said, "line counts differ") and not (ws.root / "t2").exists(), \
        "(test files of 2 and 1 lines) sanlab train", said


@check
def average_more_than_saved(ws):
    ws.trained("one", "--set", "train.max_steps=1")
    code, said = ws.sanlab("average", "--run", "one", "--last", "3")
    return _refused(code, said, "saved only 1 so far"), "sanlab average --run one --last 3", said


@check
def checkpoint_nosuch(ws):
    ws.base()
    code, said = ws.sanlab("evaluate", "--run", "base", "--checkpoint", "nosuch")
    return _refused(code, said, "best, last, averaged", "step-00000002"), \
        "sanlab evaluate --run base --checkpoint nosuch", said


@check
def quoted_yaml_values(ws):
    raw = ws.raw()
    raw["model"].update(dropout="0.1", tie_output="no")
    ws.recipe("quoted.yaml", raw)
    code, said = ws.sanlab("train", "quoted.yaml", "--run", "q", "--print-config")
    set_code, _ = ws.sanlab("train", "mt.yaml", "--set", "model.dropout=0.1", "--set", "model.tie_output=no",
                            "--print-config")
    return _refused(code, said, "model.dropout", "model.tie_output", "quoted") and set_code == 0, \
        "(dropout: \"0.1\", tie_output: \"no\") sanlab train quoted.yaml; --set model.dropout=0.1 works", said


@check
def conllu_range_beyond_the_sentence(ws):
    rows = ["1-3\tcannot\t_\t_\t_\t_\t_\t_\t_\t_", "1\tcan\t_\tAUX\t_\t_\t0\troot\t_\t_",
            "2\tnot\t_\tPART\t_\t_\t1\tadvmod\t_\t_"]
    (ws.data / "tag.conllu").write_text("\n".join(rows) + "\n\n")
    raw = {"task": "tagging", "data": {"train": str(ws.data / "tag.conllu"), "dev": str(ws.data / "tag.conllu")}}
    ws.recipe("tag.yaml", raw)
    code, said = ws.sanlab("train", "tag.yaml", "--run", "tag")
    return _refused(code, said, "tag.conllu:1: multiword token ends at word 3"), \
        "(range 1-3 in a sentence of 2 words) sanlab train tag.yaml", said


@check
def translate_a_plain_string(ws):
    from sanlab.runs import load_trained
    from sanlab.tasks.translation import translate

    config, model, spm = load_trained(ws.base())
    try:
        translate(model, spm, "a b c", decode=config.decode)
    except TypeError as err:
        return "list of sentences" in str(err), "translate(model, spm, \"a b c\", ...)", str(err)
    return False, "translate(model, spm, \"a b c\", ...)", "translated"


@check
def metrics_after_a_crash(ws):
    """Killed after update 4, before its checkpoint: the rerun trains 3-4 again and logs them once."""
    run = ws.trained("crash", "--set", "train.max_steps=4", "--set", "train.valid_every=2", "--set",
                     "train.log_every=1")
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    (run / "checkpoints" / "latest.json").write_text(json.dumps({"checkpoint": "step-00000002"}))
    ws.trained("crash", "--set", "train.max_steps=4", "--set", "train.valid_every=2", "--set", "train.log_every=1")
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    return steps == [1, 2, 3, 4], "(crash after update 4) sanlab train ... --run crash (again)", f"train records {steps}"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Exit status: 0 when every check is as expected, 1 when one is not, "
                                            "2 for a usage error.")
    parser.add_argument("--list", action="store_true", help="print the checks' names and exit")
    parser.add_argument("--only", action="append", default=[], metavar="CHECK",
                        help="run this check alone, by its exact name (repeatable; see --list)")
    args = parser.parse_args(argv)
    known = [probe.__name__ for probe in CHECKS]
    unknown = [name for name in args.only if name not in known]
    if unknown:
        parser.error(f"--only: no check named {', '.join(map(repr, unknown))}; the checks are: {', '.join(known)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        print("\n".join(probe.__name__ for probe in CHECKS))
        return 0
    chosen = [probe for probe in CHECKS if not args.only or probe.__name__ in args.only]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="sanlab-probe-") as tmp:
        ws = Workspace(Path(tmp))
        for probe in chosen:
            try:
                ok, command, said = probe(ws)
            except Exception as err:  # noqa: BLE001  (a traceback is a failed probe, reported on its line)
                ok, command, said = False, probe.__name__, f"{type(err).__name__}: {err}"
            failed += not ok
            said = said[said.find("sanlab "):] if "sanlab " in said else said  # the message, not the log before it
            print(f"{'ok  ' if ok else 'FAIL'}  {command}  ->  {' '.join(said.split())[:160]}", flush=True)
    print(f"{len(chosen) - failed} of {len(chosen)} as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
