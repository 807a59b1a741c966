"""``sanlab compare`` end to end: running, reusing and resuming cells, conflicts, failed and dead workers,
``--table-only``, ``--import`` of cells trained elsewhere and the ``--dry-run`` estimate.

These run the shipped smoke grid (configs/compare/smoke-synthetic.yaml, a synthetic tagging corpus) shrunk
further by ``--set`` so each cell trains for a handful of steps, once per module (``finished``), and a small
translation grid.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from sanlab.errors import ConfigError, TrainingError
from sanlab.experiments import cells as cells_module
from sanlab.experiments.compare import build_report, describe_cells, majority_mark, run_compare, run_grid, select_cells
from sanlab.experiments.compare_report import mismatched_finished_cells
from sanlab.experiments.grid import cell_state, load_grid
from sanlab.files import read_json
from sanlab.experiments.tables import render_markdown
from sanlab.runs import git_revision, train_run

from compare_fixtures import write

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "compare" / "smoke-synthetic.yaml"
TINY = ["model.word_dim=8", "model.char_dim=4", "model.char_filters=4", "model.encoder.layers=1",
        "train.batch_size=32", "train.max_steps=4", "train.valid_every=2", "train.max_epochs=1000",
        "train.keep_best=1", "train.keep_last=1"]


def _statuses(grid, cells=None) -> dict[tuple[str, int], str]:
    return {(c.variant, c.seed): cell_state(c, grid.spec.eval).status for c in cells or grid.cells}


# ----------------------------------------------------------------------------- end to end on the smoke grid
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """The smoke grid (2 variants x 2 seeds), run once to the end."""
    import torch

    torch.set_num_threads(1)
    runs = tmp_path_factory.mktemp("smoke")
    grid = load_grid(SMOKE, overrides=TINY, runs_dir=runs)
    assert set(_statuses(grid).values()) == {"pending"}
    outcomes = run_grid(grid, grid.cells, log=lambda m: None, quiet=True)
    assert [o.error for o in outcomes] == [None] * 4
    return grid


def test_run_evaluates_every_cell_and_writes_the_table(finished, capsys):
    assert set(_statuses(finished).values()) == {"evaluated"}
    assert run_compare(str(SMOKE), overrides=TINY, runs_dir=str(finished.runs_dir), table_only=True,
                       command="sanlab compare smoke") == 0
    printed = capsys.readouterr().out
    table = (finished.runs_dir / "table.md").read_text(encoding="utf-8")
    assert table in printed and "- cells done: 4 of 4" in table and "- command: sanlab compare smoke" in table
    assert "- cells trained by: " in table  # from the cells' meta.json: --table-only does not hide how they were made
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows] == ["| variant", "| SAN+PE[add] (baseline)", "| 1D-CSAN"]
    report = json.loads((finished.runs_dir / "table.json").read_text(encoding="utf-8"))
    base, csan = report["sections"][0]["rows"]
    assert base["tests"] == [] and [t["seed"] for t in csan["tests"]] == [0, 1]
    assert csan["mark"] == majority_mark([t["mark"] for t in csan["tests"]])[0]
    for row in (base, csan):  # mean ± sd over the two seeds' own evaluation records
        seeds = [json.loads((finished.runs_dir / ("san-pe-add" if row is base else "1d-csan") / f"seed-{s}"
                             / "compare-eval.json").read_text())["scores"]["all"] for s in (0, 1)]
        assert row["scores"]["All"]["mean"] == pytest.approx(sum(seeds) / 2)
        assert row["scores"]["All"]["sd"] == pytest.approx(abs(seeds[0] - seeds[1]) / math.sqrt(2))
    assert base["params"] == csan["params"] and csan["params_delta"] == 0  # a window adds no parameters
    assert base["steps_per_s"]["n"] == 2 and base["steps_per_s"]["mean"] > 0
    assert (finished.runs_dir / "table.csv").exists()


def test_every_mode_refuses_cells_trained_on_another_synthetic_corpus(finished, tmp_path):
    text = SMOKE.read_text().replace("base: ../ud-ewt-tagger.yaml", f"base: {ROOT / 'configs' / 'ud-ewt-tagger.yaml'}")
    other = write(tmp_path / "other.yaml", text.replace("synthetic: {task: tagging, seed: 1,",
                                                         "synthetic: {task: tagging, seed: 2,"))
    for mode in ({"dry_run": True}, {"table_only": True}):
        with pytest.raises(ConfigError, match="holds a synthetic corpus made with .*'seed': 1.*the grid now asks"):
            run_compare(str(other), overrides=TINY, runs_dir=str(finished.runs_dir), command="t",
                        out=lambda m: None, **mode)
    with pytest.raises(ConfigError, match="--dry-run and --table-only: choose one"):
        run_compare(str(SMOKE), dry_run=True, table_only=True)
    for mode, flag in (({"table_only": True}, "--table-only"), ({"rescore": True}, "--rescore"),
                       ({"dry_run": True}, "--dry-run"), ({"imports": ["cells.tar.gz"]}, "--import")):
        with pytest.raises(ConfigError, match=f"--jobs 2 with {flag}, which trains no cell: drop --jobs"):
            run_compare(str(SMOKE), jobs=2, **mode)
    for selection in ({"only": ["vanilla"]}, {"datasets": ["ewt"]}, {"seeds": [1]}):
        with pytest.raises(ConfigError, match="--table-only prints the whole table; --only, --dataset and --seed"):
            run_compare(str(SMOKE), table_only=True, **selection)


def test_second_invocation_reuses_finished_cells(finished, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("a finished cell was trained again")

    monkeypatch.setattr(cells_module, "train_run", no_training)
    monkeypatch.setattr(cells_module, "score_cell", no_training)
    stamps = {c.run_dir: (c.run_dir / "done.json").stat().st_mtime_ns for c in finished.cells}
    assert run_grid(finished, finished.cells, log=lambda m: None) == []
    assert stamps == {c.run_dir: (c.run_dir / "done.json").stat().st_mtime_ns for c in finished.cells}
    assert "4 of 4 cells evaluated" in describe_cells(finished, finished.cells)


def test_another_device_does_not_make_finished_cells_train_again(finished, monkeypatch):
    """``compare --device cpu`` (``train.device=cpu``) on cells trained with ``auto``: a device does not change
    what was trained, so the cells stay evaluated (a grid trained on a GPU is scored where it is read)."""
    import argparse

    from sanlab.experiments import compare_cli

    parser = argparse.ArgumentParser(prog="sanlab")
    compare_cli.register(parser.add_subparsers(dest="command"))
    import os

    from sanlab.runs import ALLOW_CHANGED_DATA_ENV

    seen = {}

    def fake_run_compare(path, **kwargs):  # what the grid (and its spawned workers) would see
        seen.update(kwargs, allow=os.environ.get(ALLOW_CHANGED_DATA_ENV))
        return 0

    monkeypatch.setattr("sanlab.experiments.compare.run_compare", fake_run_compare)
    monkeypatch.delenv(ALLOW_CHANGED_DATA_ENV, raising=False)
    args = parser.parse_args(["compare", str(SMOKE), "--device", "cpu", "--set", "train.max_steps=3"])
    assert args.fn(args) == 0 and seen["overrides"] == ["train.max_steps=3", "train.device=cpu"]
    assert seen["allow"] is None
    args = parser.parse_args(["compare", str(SMOKE), "--allow-changed-data"])
    assert args.fn(args) == 0 and seen["allow"] == "1" and ALLOW_CHANGED_DATA_ENV not in os.environ
    grid = load_grid(SMOKE, overrides=TINY + ["train.device=cpu"], runs_dir=finished.runs_dir)
    assert finished.cells[0].config.train.device == "auto" and grid.cells[0].config.train.device == "cpu"
    assert set(_statuses(grid).values()) == {"evaluated"}
    # nor does a switch that only tells DDP where to look for unused parameters (a resume would rescore all), or
    # one that chooses deterministic kernels
    for switch in ("train.find_unused_parameters=true", "train.deterministic=true"):
        grid = load_grid(SMOKE, overrides=TINY + [switch], runs_dir=finished.runs_dir)
        assert set(_statuses(grid).values()) == {"evaluated"}, switch


def test_a_seed_set_for_every_cell_is_refused_not_silently_replaced(tmp_path):
    """Each cell's seed is set last; a --set train.seed (or the grid's set:) would be replaced by it without a
    word, while the table's header listed it."""
    with pytest.raises(ConfigError, match="--set train.seed: each cell's seed comes from the grid's seeds"):
        load_grid(SMOKE, overrides=[*TINY, "train.seed=5"], runs_dir=tmp_path)


def test_a_done_json_not_of_the_form_sanlab_writes_is_a_conflict_naming_it(finished):
    """Valid JSON without the keys ``train_cell`` writes (edited or cut outside sanlab): that cell is a conflict
    whose detail names the file; the other cells and every mode go on (a KeyError stopped them before)."""
    cell = finished.cells[0]
    text = cell.layout.done.read_text()
    try:
        cell.layout.done.write_text(json.dumps({k: v for k, v in json.loads(text).items() if k != "config"}))
        state = cell_state(cell, finished.spec.eval)
        assert state.status == "conflict" and f"{cell.layout.done}: not a record of a finished cell" in state.detail
        assert set(_statuses(finished).values()) == {"evaluated", "conflict"}
    finally:
        cell.layout.done.write_text(text)
    assert cell_state(cell, finished.spec.eval).status == "evaluated"


def test_a_cell_finished_by_another_invocation_meanwhile_is_not_trained_again(finished):
    """Two `sanlab compare` on one grid: the second looked at a cell before the first finished it, and reaches
    its lock after. Training it would resume it with no update, write its done.json and a session again (its
    speed then reads as mixed); it is refused instead, and nothing of it changes."""
    from sanlab.experiments.cells import FinishedMeanwhile, run_cell, train_cell

    cell = finished.cells[1]
    before = {name: (cell.run_dir / name).read_bytes() for name in ("done.json", "meta.json", "compare-eval.json")}
    with pytest.raises(FinishedMeanwhile, match=r"evaluated \(step \d+\) by another process meanwhile; not trained "
                                                r"again"):
        train_cell(cell, quiet=True, spec=finished.spec.eval)
    assert {name: (cell.run_dir / name).read_bytes() for name in before} == before
    # run_cell, having seen it pending: no failure recorded in the cell the other one finished, no error
    import sanlab.experiments.cells as cells
    from sanlab.experiments.grid_state import CellState

    real = cells.cell_state
    seen = iter([CellState("pending")])
    with pytest.MonkeyPatch.context() as m:
        m.setattr(cells, "cell_state", lambda c, s: next(seen, None) or real(c, s))
        outcome = run_cell(cell, finished.spec.eval, quiet=True)
    assert outcome.error is None and not outcome.trained and not cell.layout.failed.exists()
    assert {name: (cell.run_dir / name).read_bytes() for name in before} == before


def test_a_cell_another_invocation_is_training_is_left_to_it_not_marked_failed(tmp_path):
    """Two `sanlab compare` on one grid: the second reaches a cell whose run lock the first holds. It is
    reported, but nothing is written into the cell: a failed.json there would make the table (and a --dry-run)
    call a cell failed that the other invocation is training, and would stay if that one then failed to remove
    it first."""
    from sanlab.experiments.cells import run_cell
    from sanlab.runs import run_lock

    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    cell = select_cells(grid, only=["1D-CSAN"], seeds=[0])[0]
    with run_lock(cell.run_dir):  # the other invocation, training it
        outcome = run_cell(cell, grid.spec.eval, quiet=True)
    assert "is being trained or evaluated by another process" in outcome.error
    assert not outcome.trained and not cell.layout.failed.exists()
    assert "| 1D-CSAN | 0/2 |" in render_markdown(build_report(grid, command="test"))


def test_killed_cell_resumes_and_the_rest_is_untouched(tmp_path):
    import torch

    torch.set_num_threads(1)
    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    cells = select_cells(grid, only=["1d-csan"])  # by directory slug
    cells_module.prepare_synthetic(grid)
    killed = cells[0]
    # a grid killed mid-training: checkpoints at step 2, no done.json
    train_run(killed.config.model_copy(update={"train": killed.config.train.model_copy(update={"max_steps": 2})}),
              killed.run_dir, quiet=True)
    assert cell_state(killed, grid.spec.eval).describe() == "training step 2"
    assert _statuses(grid, cells) == {("1D-CSAN", 0): "training", ("1D-CSAN", 1): "pending"}
    outcomes = run_grid(grid, cells, log=lambda m: None, quiet=True)
    assert [o.error for o in outcomes] == [None, None]
    assert "resumed from" in (killed.run_dir / "train.log").read_text()
    assert json.loads((killed.run_dir / "done.json").read_text())["summary"]["step"] == 4
    valid_steps = [r["step"] for r in map(json.loads, (killed.run_dir / "metrics.jsonl").read_text().splitlines())
                   if r["split"] == "valid"]
    assert valid_steps == [2, 4]  # continued, not restarted
    assert _statuses(grid) == {("SAN+PE[add]", 0): "pending", ("SAN+PE[add]", 1): "pending",
                               ("1D-CSAN", 0): "evaluated", ("1D-CSAN", 1): "evaluated"}
    report = build_report(grid, command="test")
    assert "2 of 4 — partial table" in report.header["cells done"]


def test_header_keeps_the_grids_set_apart_from_this_commands_set(finished):
    # cells trained earlier by another command may differ in resumable keys (train.threads), so this command's
    # --set must not be presented as what every cell was trained with
    header = build_report(finished, command="t").header
    assert header["overrides for every cell (grid set:)"].startswith("model.word_dim=32 model.char_dim=16 ")
    assert "train.patience=0" in header["overrides for every cell (grid set:)"]
    assert header["overrides for every cell (grid set:)"].endswith(" train.progress=false")  # as --set takes it
    assert header["--set of this command"] == " ".join(TINY)


def test_table_only_with_other_settings_does_not_overwrite_the_table(finished, capsys):
    table = finished.runs_dir / "table.md"
    assert run_compare(str(SMOKE), overrides=TINY, runs_dir=str(finished.runs_dir), table_only=True, command="t",
                       out=lambda m: None) == 0  # the table exists, whichever tests ran before
    before = table.read_text(encoding="utf-8")
    # a forgotten --set: the finished cells would "continue" to 8 steps and drop out of the table
    assert run_compare(str(SMOKE), overrides=[*TINY, "train.max_steps=8"], runs_dir=str(finished.runs_dir),
                       table_only=True, command="sanlab compare smoke") == 1
    printed = capsys.readouterr().out
    assert f"NOT written to {finished.runs_dir}: 4 finished cell(s)" in printed
    assert "SAN+PE[add] / seed 0: training step 4 — continues: train.max_steps changed" in printed
    assert table.read_text(encoding="utf-8") == before


def test_a_cell_trained_on_outside_the_grid_is_a_conflict(finished, monkeypatch):
    from sanlab.experiments import grid_state as grid_module  # where cell_state reads latest_step

    cell = finished.cells[0]
    done_step = json.loads((cell.run_dir / "done.json").read_text())["summary"]["step"]
    monkeypatch.setattr(grid_module, "latest_step", lambda run: done_step + 5 if run == cell.run_dir else None)
    state = cell_state(cell, finished.spec.eval)
    assert (state.status, state.detail) == ("conflict", f"trained on after the grid finished it (checkpoints reach "
                                            f"step {done_step + 5}, done.json says {done_step}): not the grid's cell "
                                            "any more")
    # and so is it under a budget the grid changed that would have stopped it where done.json says
    same_run = load_grid(SMOKE, overrides=[*TINY, "train.max_epochs=2000"], runs_dir=finished.runs_dir)
    assert cell_state(same_run.cells[0], same_run.spec.eval).detail == state.detail
    # but a budget the grid itself raised resumes past done.json (e.g. killed after a checkpoint): it goes on
    longer = load_grid(SMOKE, overrides=[*TINY, f"train.max_steps={done_step + 20}"], runs_dir=finished.runs_dir)
    assert cell_state(longer.cells[0], longer.spec.eval).status == "training"


def test_cells_trained_by_names_only_the_commands_of_cells_in_the_table(finished):
    """A cell still training (another process, another session) is not in the table, nor its command."""
    cell = finished.cells[-1]
    meta, record = cell.run_dir / "meta.json", cell.run_dir / "compare-eval.json"
    originals = meta.read_bytes(), record.read_bytes()
    marker = ["sanlab", "compare", "smoke.yaml", "--only", cell.variant, "--seed", str(cell.seed)]
    report = lambda: build_report(load_grid(SMOKE, overrides=TINY, runs_dir=finished.runs_dir),  # noqa: E731
                                  command="t")
    try:
        meta.write_text(json.dumps({**json.loads(originals[0]), "command": marker}))
        assert " ".join(marker) in report().header["cells trained by"]  # evaluated: its command is named
        record.unlink()  # now it has trained but is not evaluated: out of the table
        partial = report()
        assert " ".join(marker) not in partial.header.get("cells trained by", "")
        assert "cells done: 3 of 4" in render_markdown(partial)
    finally:
        meta.write_bytes(originals[0])
        record.write_bytes(originals[1])


def test_cells_trained_by_names_the_command_of_every_session_of_a_cell(finished):
    """A cell resumed by another command (another queue, other threads) names both: the first command
    alone would hide how most of its updates were made."""
    cell = finished.cells[0]
    meta = cell.run_dir / "meta.json"
    original = meta.read_bytes()
    first = ["sanlab", "compare", "smoke.yaml", "--jobs", "2"]
    resumed = ["sanlab", "compare", "smoke.yaml", "--seed", str(cell.seed), "--set", "train.threads=2"]
    try:
        recorded = json.loads(original)
        sessions = [{**s, "command": first} for s in recorded["sessions"]] + [{**recorded["sessions"][-1],
                                                                                "command": resumed}]
        meta.write_text(json.dumps({**recorded, "command": first, "sessions": sessions}))
        header = build_report(load_grid(SMOKE, overrides=TINY, runs_dir=finished.runs_dir), command="t").header
        assert " ".join(first) in header["cells trained by"] and " ".join(resumed) in header["cells trained by"]
    finally:
        meta.write_bytes(original)


def test_a_damaged_meta_json_does_not_stop_the_table(finished):
    """meta.json is provenance (speed conditions, training commands): the table says it is unreadable."""
    meta = finished.cells[0].run_dir / "meta.json"
    original = meta.read_bytes()
    try:
        meta.write_text('{"seed": 0, "sess')
        table = render_markdown(build_report(load_grid(SMOKE, overrides=TINY, runs_dir=finished.runs_dir),
                                             command="test"))
        assert "unknown (meta.json unreadable)" in table
    finally:
        meta.write_bytes(original)


def test_a_damaged_metrics_line_loses_the_speed_not_the_table(finished):
    metrics = finished.cells[0].run_dir / "metrics.jsonl"
    original = metrics.read_bytes()
    try:
        metrics.write_bytes(b"not a record\n" + original)
        report = build_report(load_grid(SMOKE, overrides=TINY, runs_dir=finished.runs_dir), command="test")
        table = render_markdown(report)
        assert f"unknown (metrics.jsonl unreadable: {metrics}:1: not a JSON record" in table
        assert "cells done: 4 of 4" in table  # its scores are still in
    finally:
        metrics.write_bytes(original)


def test_evidence_rewritten_after_scoring_makes_the_cell_score_again(finished):
    cell = finished.cells[0]
    record = json.loads((cell.run_dir / "compare-eval.json").read_text())
    assert record["git_revision"] == git_revision()  # the code that scored it (provenance, not in the key)
    evidence = cell.run_dir / record["evidence"]
    original = evidence.read_bytes()
    try:
        evidence.write_bytes(gzip.compress(b""))  # e.g. another tool rewrote it
        state = cell_state(cell, finished.spec.eval)
        assert (state.status, state.detail) == ("trained", f"{record['evidence']} or the recorded scores changed "
                                                           "(or the file is missing) since it was scored")
    finally:
        evidence.write_bytes(original)
    assert cell_state(cell, finished.spec.eval).status == "evaluated"
    path = cell.run_dir / "compare-eval.json"
    text = path.read_text()
    try:  # a score edited by hand is not taken: the cell is scored again
        path.write_text(json.dumps({**record, "scores": {**record["scores"], "all": 99.0}}))
        assert cell_state(cell, finished.spec.eval).status == "trained"
    finally:
        path.write_text(text)
    assert cell_state(cell, finished.spec.eval).status == "evaluated"


def test_damaged_json_and_a_dataset_on_a_grid_without_datasets_are_named(finished, tmp_path):
    bad = write(tmp_path / "done.json", '{"summary": ')
    with pytest.raises(ConfigError, match=f"{bad}: not valid JSON"):
        read_json(bad)
    with pytest.raises(ConfigError, match="--dataset 'x', but this grid has no datasets"):
        select_cells(finished, datasets=["x"])


def test_a_lower_patience_makes_finished_cells_conflict_instead_of_being_relabelled(finished):
    # the smoke cells trained with patience 0 (never stop early): any patience would have stopped them sooner
    tighter = load_grid(SMOKE, overrides=[*TINY, "train.patience=1"], runs_dir=finished.runs_dir)
    state = cell_state(tighter.cells[0], tighter.spec.eval)
    assert state.status == "conflict" and "train.patience=0; train.patience=1 would stop it" in state.detail
    longer = load_grid(SMOKE, overrides=[*TINY, "train.max_steps=6"], runs_dir=finished.runs_dir)
    assert cell_state(longer.cells[0], longer.spec.eval).status == "training"  # a larger budget trains on


def test_a_budget_change_that_adds_no_update_keeps_the_finished_cell(finished):
    # the smoke cells stopped at train.max_steps=4: a larger max_epochs or a looser patience would have stopped
    # them there too, so resuming would add no update, only score them again and rewrite done.json
    cell = finished.cells[0]
    done = (cell.run_dir / "done.json").read_bytes()
    for change in ("train.max_epochs=2000", "train.max_steps=4"):
        grid = load_grid(SMOKE, overrides=[*TINY, change], runs_dir=finished.runs_dir)
        state = cell_state(grid.cells[0], grid.spec.eval)
        assert state.status == "evaluated"
    assert state.detail == ""  # nothing changed
    grid = load_grid(SMOKE, overrides=[*TINY, "train.max_epochs=2000"], runs_dir=finished.runs_dir)
    state = cell_state(grid.cells[0], grid.spec.eval)
    assert state.detail == "train.max_epochs changed, but it would stop at step 4 all the same"
    assert mismatched_finished_cells(grid) == []
    assert run_grid(grid, grid.cells[:1], log=lambda m: None, quiet=True) == []  # nothing to run
    assert (cell.run_dir / "done.json").read_bytes() == done


def test_a_changed_budget_goes_on_only_where_it_lifts_what_stopped_the_run(finished):
    from sanlab.experiments.grid_state import _goes_on

    real = json.loads((finished.cells[0].run_dir / "done.json").read_text())

    def done(step: int, epoch: int, bad: int | None = None, **train) -> dict:
        config = {**real["config"], "train": {**real["config"]["train"], **train}}
        summary = {**real["summary"], "step": step, "epoch": epoch, "position": 0, "bad_validations": bad}
        if bad is None:  # recorded before done.json had it: told from the limits
            del summary["bad_validations"]
        return {**real, "config": config, "summary": summary}

    def under(*overrides: str):
        return load_grid(SMOKE, overrides=[*TINY, *overrides], runs_dir=finished.runs_dir).cells[0].config

    at_steps = done(4, 0, max_steps=4, max_epochs=1000, patience=0)
    assert _goes_on(at_steps, under("train.max_steps=8"))
    assert not _goes_on(at_steps, under("train.max_epochs=2000"))
    at_epochs = done(12, 3, max_steps=1000, max_epochs=3, patience=0)
    assert _goes_on(at_epochs, under("train.max_steps=1000", "train.max_epochs=5"))
    assert not _goes_on(at_epochs, under("train.max_steps=2000", "train.max_epochs=3"))
    # a run whose last validation at its limit also used up its patience stops there under a larger limit too
    both = done(4, 0, bad=1, max_steps=4, max_epochs=1000, patience=1)
    assert not _goes_on(both, under("train.max_steps=8", "train.patience=1"))
    assert _goes_on(both, under("train.max_steps=8", "train.patience=2"))
    for bad in (None, 2):  # told from the limits, or recorded
        early = done(10, 2, bad, max_steps=1000, max_epochs=6, patience=2)
        assert _goes_on(early, under("train.max_steps=1000", "train.max_epochs=6", "train.patience=3"))
        assert _goes_on(early, under("train.max_steps=1000", "train.max_epochs=6", "train.patience=0"))
        assert not _goes_on(early, under("train.max_steps=2000", "train.max_epochs=6", "train.patience=2"))


def test_a_finished_cell_without_its_checkpoints_is_never_trained_or_scored_again(finished, tmp_path):
    """A committed or imported cell keeps no checkpoints: a larger budget or other evaluation settings cannot
    be served by training it again from scratch over its results, or by a 'no checkpoint to load' failure."""
    import shutil

    from sanlab.experiments.grid_schema import EvalSpec

    cell = finished.cells[1]
    kept = {n: (cell.run_dir / n).read_bytes() for n in ("done.json", "compare-eval.json", "metrics.jsonl")}
    shutil.move(cell.run_dir / "checkpoints", tmp_path / "checkpoints")
    try:
        assert cell_state(cell, finished.spec.eval).status == "evaluated"
        longer = load_grid(SMOKE, overrides=[*TINY, "train.max_steps=8"], runs_dir=finished.runs_dir)
        state = cell_state(longer.cells[1], longer.spec.eval)
        assert state.status == "conflict"
        assert state.detail.startswith("train.max_steps changed, which would train it on from step 4, but its "
                                       "checkpoints are not here (a committed or imported cell)")
        (outcome,) = run_grid(longer, [longer.cells[1]], log=lambda m: None, quiet=True)
        assert "its checkpoints are not here" in outcome.error
        last = EvalSpec(**{**finished.spec.eval.model_dump(), "checkpoint": "last"})
        state = cell_state(cell, last)
        assert state.status == "conflict" and "checkpoint=best" in state.detail and "checkpoint=last" in state.detail
        assert "cannot be scored again" in state.detail
        with pytest.raises(ConfigError, match="a finished grid cell whose checkpoints are not here"):
            train_run(cell.config, cell.run_dir, quiet=True)
        assert {n: (cell.run_dir / n).read_bytes() for n in kept} == kept
    finally:
        shutil.move(tmp_path / "checkpoints", cell.run_dir / "checkpoints")
    state = cell_state(cell, EvalSpec(**{**finished.spec.eval.model_dump(), "checkpoint": "last"}))
    assert state.status == "trained"  # with its checkpoints it is scored again
    assert state.detail.startswith("scored with checkpoint=best")


def test_a_cell_to_rescore_without_its_checkpoints_is_left_to_rescore(finished, tmp_path):
    """Scored with the word groups before 2026-11-25 and committed without checkpoints: a grid run says --rescore
    (which needs no model) instead of failing with 'no checkpoint to load' and writing failed.json into it."""
    import shutil

    from sanlab.experiments.cells import run_cell

    cell = finished.cells[1]
    record_path = cell.run_dir / "compare-eval.json"
    original = record_path.read_bytes()
    record = json.loads(original)
    record["key"] = {k: v for k, v in record["key"].items() if k != "word_groups"}  # the old definitions
    record_path.write_text(json.dumps(record))
    shutil.move(cell.run_dir / "checkpoints", tmp_path / "checkpoints")
    try:
        outcome = run_cell(cell, finished.spec.eval, quiet=True)
        assert "--rescore` scores it again from its predictions (its checkpoints are not here)" in outcome.error
        assert not (cell.run_dir / "failed.json").exists()
    finally:
        shutil.move(tmp_path / "checkpoints", cell.run_dir / "checkpoints")
        record_path.write_bytes(original)
    assert cell_state(cell, finished.spec.eval).status == "evaluated"


def test_training_data_changed_in_place_is_a_conflict_for_finished_cells(finished, monkeypatch):
    cell = finished.cells[0]
    train = Path(cell.config.data.train)
    original = train.read_bytes()
    try:
        train.write_bytes(original + b"\n")
        state = cell_state(cell, finished.spec.eval)
        assert state.status == "conflict"
        assert state.detail.startswith(f"the training data changed since it was trained ({train}: ")
        assert "pass --allow-changed-data to keep it as it was trained" in state.detail
        monkeypatch.setenv("SANLAB_ALLOW_CHANGED_DATA", "1")
        assert cell_state(cell, finished.spec.eval).status == "evaluated"
    finally:
        train.write_bytes(original)
    monkeypatch.delenv("SANLAB_ALLOW_CHANGED_DATA")
    assert cell_state(cell, finished.spec.eval).status == "evaluated"  # the same bytes again (whole-file sha256)


def test_a_test_file_changed_after_scoring_makes_the_cell_score_again(finished):
    cell = finished.cells[0]
    assert run_compare(str(SMOKE), overrides=TINY, runs_dir=str(finished.runs_dir), table_only=True,
                       command="t", out=lambda m: None) == 0  # the table of the evaluated cells
    record = json.loads((cell.run_dir / "compare-eval.json").read_text())
    (path,) = record["data_sha256"]
    original = Path(path).read_bytes()
    try:
        Path(path).write_bytes(original + b"\n")  # corrected in place
        state = cell_state(cell, finished.spec.eval)
        assert (state.status, state.detail) == ("trained", f"{path} changed since the cell was scored")
        table = (finished.runs_dir / "table.md").read_text(encoding="utf-8")
        # --table-only cannot score them again: it must not write a table without their scores
        assert run_compare(str(SMOKE), overrides=TINY, runs_dir=str(finished.runs_dir), table_only=True,
                           command="t", out=lambda m: None) == 1
        assert (finished.runs_dir / "table.md").read_text(encoding="utf-8") == table
    finally:
        Path(path).write_bytes(original)
    assert cell_state(cell, finished.spec.eval).status == "evaluated"


def test_a_failed_cell_leaves_its_error_in_the_table_until_it_succeeds(tmp_path, monkeypatch):
    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    cells = select_cells(grid, only=["1D-CSAN"])

    def nan_loss(cell, **kwargs):
        raise TrainingError("loss is nan at update 3 (epoch 0)")

    monkeypatch.setattr(cells_module, "train_cell", nan_loss)
    outcomes = run_grid(grid, cells, log=lambda m: None, quiet=True)
    assert all(o.error == "TrainingError: loss is nan at update 3 (epoch 0)" for o in outcomes)  # no traceback
    report = build_report(grid, command="test")
    table = render_markdown(report)
    assert "| 1D-CSAN | 0/2 (2 failed) |" in table
    assert "1D-CSAN / seed 1  pending (last attempt failed: TrainingError: loss is nan at update 3 (epoch 0))" in \
        describe_cells(grid, cells)
    assert "- FAILED 1D-CSAN / seed 0: TrainingError: loss is nan at update 3 (epoch 0)" in table
    monkeypatch.undo()
    import torch

    torch.set_num_threads(1)
    assert [o.error for o in run_grid(grid, cells[:1], log=lambda m: None, quiet=True)] == [None]
    assert not (cells[0].run_dir / "failed.json").exists()
    assert "| 1D-CSAN | 1/2 (1 failed) |" in render_markdown(build_report(grid, command="test"))


def test_a_dead_worker_sends_its_cells_to_a_new_pool_then_each_to_its_own(tmp_path, monkeypatch):
    """A worker killed (e.g. by the OOM killer) breaks the pool, which fails every cell it held: they go to
    a new pool; if that breaks too, each left goes to a pool of its own, where a death is the cell's own."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from sanlab.experiments import running

    pools, breaks = [], {"SAN+PE[add] / seed 0": 1, "SAN+PE[add] / seed 1": 3}

    class DyingPool:
        def __init__(self, *, max_workers, **kwargs):
            pools.append(max_workers)

        def shutdown(self, wait=True, *, cancel_futures=False):
            pass

        def submit(self, fn, job):
            future, label = Future(), job[0].label
            if breaks.get(label, 0) > 0:
                breaks[label] -= 1
                future.set_exception(BrokenProcessPool("a child process terminated abruptly"))
            else:
                future.set_result(cells_module.CellOutcome(job[0], True, True, 0.0))
            return future

    monkeypatch.setattr(running, "ProcessPoolExecutor", DyingPool)
    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    logged = []
    outcomes = run_grid(grid, grid.cells, jobs=2, log=logged.append)
    by_label = {o.cell.label: o.error for o in outcomes}
    assert pools == [2, 2, 1] and len(outcomes) == 4  # all 4, the 2 broken, then the one left alone
    assert by_label["SAN+PE[add] / seed 0"] is None and by_label["1D-CSAN / seed 1"] is None
    assert "its worker process died" in by_label["SAN+PE[add] / seed 1"]
    dead = next(c for c in grid.cells if c.label == "SAN+PE[add] / seed 1")
    assert (dead.run_dir / "failed.json").exists()
    assert [m for m in logged if m.startswith("a worker")] == [
        "a worker process died; 2 cell(s) go to a new pool",
        "a worker process died; 1 cell(s) go to pools of their own, one at a time, to find the one that dies"]


@pytest.mark.slow  # spawns worker processes that import torch: ~6 s
def test_jobs_run_cells_in_spawned_processes(tmp_path):
    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    cells = select_cells(grid, only=["SAN+PE[add]"])
    outcomes = run_grid(grid, cells, jobs=2, log=lambda m: None)
    assert [o.error for o in outcomes] == [None, None]
    from sanlab.experiments.cells import cores

    done = [json.loads((c.run_dir / "done.json").read_text()) for c in cells]
    assert {(d["threads"], d["jobs"]) for d in done} == {(max(1, cores() // 2), 2)}
    assert set(_statuses(grid, cells).values()) == {"evaluated"}


def test_the_grid_answers_a_ctrl_c_that_another_of_its_threads_received():
    """The kernel may hand a process's SIGINT to any thread not blocking it; the grid process waiting for its
    workers must still stop at once, not when a cell ends (a CI run under load saw it wait past 90 s)."""
    import signal
    import threading
    from concurrent.futures import Future

    from sanlab.experiments import running

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Python runs signal handlers in the main thread only; this test runs in another")
    training = Future()  # a cell still training
    bystander = threading.Event()
    thread = threading.Thread(target=bystander.wait, daemon=True)  # another thread, SIGINT not blocked
    thread.start()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timers = [threading.Timer(0.2, signal.pthread_kill, (thread.ident, signal.SIGINT)),
              threading.Timer(10, training.set_result, (None,))]  # the cell ends: a waiting grid would stop here
    try:
        for timer in timers:
            timer.start()
        with pytest.raises(KeyboardInterrupt):
            running._collect({training: None}, [], report=lambda outcome: None, alone=False)
        assert not training.done(), "the Ctrl-C waited for the cell to end"
    finally:
        for timer in timers:
            timer.cancel()
        bystander.set()
        signal.signal(signal.SIGINT, previous)


@pytest.mark.slow  # a `sanlab compare --jobs 2` process with spawned workers: ~20 s
def test_ctrl_c_stops_a_grid_with_jobs_at_once(tmp_path):
    """Ctrl-C reaches the whole process group: the grid ends its workers and exits 130 instead of training on
    every cell already handed to the pool; the cells not started stay untouched, the others resume."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    from sanlab.experiments.running import run_order

    long = [*TINY, "train.max_steps=100000", "train.valid_every=5"]
    argv = [sys.executable, "-m", "sanlab", "compare", str(SMOKE), "--runs-dir", str(tmp_path), "--jobs", "2",
            "--quiet", *(a for o in long for a in ("--set", o))]
    # as a terminal's foreground job has it: SIGINT's default action, though this test may run where it is ignored
    # (a background job of a non-interactive shell, `nohup make test &`), which the grid would inherit and keep
    foreground = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  "os.execv(sys.argv[1], sys.argv[1:])", *argv]
    process = subprocess.Popen(foreground, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        grid = load_grid(SMOKE, overrides=long, runs_dir=tmp_path)
        order = run_order(grid, grid.cells)
        started, queued = order[:2], order[2:]  # each variant's first seed, then the second seeds
        deadline = time.monotonic() + 240
        while not all(list((c.run_dir / "checkpoints").glob("step-*")) for c in started):
            assert process.poll() is None, "the grid ended before both workers saved a checkpoint"
            assert time.monotonic() < deadline, "no checkpoint from both workers within 240 s"
            time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        try:  # the grid itself (communicate would also wait for every child holding its pipes)
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            alive = [_command_line(pid) for pid in _live_processes_in_group(process.pid)]
            raise AssertionError(f"the grid did not exit within 90 s of Ctrl-C; its group: {alive}") from None
        # no worker goes on training (the grid waited for them); multiprocessing's resource tracker, a child in the
        # same group, ends a moment after the grid does (when its pipe closes): given a few seconds, not hours
        deadline = time.monotonic() + 10
        while _live_processes_in_group(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = _live_processes_in_group(process.pid)
        assert survivors == [], [_command_line(pid) for pid in survivors]
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None or _live_processes_in_group(process.pid):
            with contextlib.suppress(ProcessLookupError):  # (ended meanwhile)
                os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, err
    assert "interrupted; rerun the same command to resume" in err
    assert [cell_state(c, grid.spec.eval).status for c in order] == ["training", "training", "pending", "pending"]
    assert not any(c.run_dir.exists() for c in queued)  # cancelled before they started


def _live_processes_in_group(pgid: int) -> list[str]:
    """The processes of a process group that are not zombies (Linux ``/proc``; a zombie waits for init to reap it)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except OSError:  # ended meanwhile
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(stat.parent.name)
    return live


def _command_line(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return f"{pid} (ended)"


def _run_translation_grid(tmp_path) -> str:
    """A 2-variant x 1-seed translation grid on a synthetic corpus, run to the end; returns table.md."""
    recipe = write(tmp_path / "mt.yaml", """\
task: translation
data: {train: {src: x, tgt: x}, valid: {src: x, tgt: x}, subword: {vocab_size: 120}}
model: {dim: 16, encoder: {layers: 1, ffn_dim: 32, attention: {heads: 2}},
        decoder: {layers: 1, ffn_dim: 32, attention: {heads: 2}}}
train: {max_tokens: 400, warmup_steps: 4, max_steps: 4, valid_every: 2, valid_max_sentences: 5, progress: false,
        keep_best: 1, keep_last: 2}
decode: {beam: 2, max_len_a: 1.0, max_len_b: 2}
""")
    grid_file = write(tmp_path / "grid.yaml", f"""\
base: {recipe.name}
synthetic: {{task: translation, sizes: {{train: 150, valid: 10, test: 20}}}}
seeds: [1]
variants:
  - {{name: vanilla}}
  - {{name: 1D-CSAN, overrides: ["model.encoder.attention.parts=[{{type: window, size: 3}}]"]}}
eval: {{checkpoint: averaged, average_last: 2, bootstrap_samples: 50}}
""")
    assert run_compare(str(grid_file), runs_dir=str(tmp_path / "runs"), quiet=True, command="t", out=lambda m: None) == 0
    return (tmp_path / "runs" / "table.md").read_text(encoding="utf-8")


def test_translation_grid_averages_checkpoints_and_prints_the_sacrebleu_signatures_once(tmp_path):
    table = _run_translation_grid(tmp_path)
    assert "| BLEU | Δ BLEU | sig. | chrF |" in table and "- data split: test" in table
    assert table.count("sacreBLEU signature: `BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:") == 1
    assert table.count("sacreBLEU signature: `chrF2|nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:") == 1
    cell = tmp_path / "runs" / "1d-csan" / "seed-1"
    assert (cell / "averaged" / "model.safetensors").exists() and (cell / "hyp-averaged-test.txt").exists()
    assert "- checkpoint: averaged (average of the last 2)" in table


def test_new_decode_settings_re_evaluate_without_retraining(tmp_path, monkeypatch):
    _run_translation_grid(tmp_path)
    grid = load_grid(tmp_path / "grid.yaml", overrides=["decode.beam=1", "decode.max_len_b=1"],
                     runs_dir=tmp_path / "runs")
    assert set(_statuses(grid).values()) == {"trained"}

    def no_training(*args, **kwargs):
        raise AssertionError("a decode change retrained a cell")

    monkeypatch.setattr(cells_module, "train_run", no_training)
    assert [o.error for o in run_grid(grid, grid.cells, log=lambda m: None)] == [None, None]
    record = json.loads((tmp_path / "runs" / "vanilla" / "seed-1" / "compare-eval.json").read_text())
    assert (record["key"]["decode"]["beam"], record["key"]["decode"]["max_len_b"]) == (1, 1)
    evaluated = json.loads((tmp_path / "runs" / "vanilla" / "seed-1" / "eval-averaged.json").read_text())
    assert evaluated["test"]["decode"]["beam"] == 1  # decoded with the grid's settings, not the saved ones
    assert set(_statuses(grid).values()) == {"evaluated"}
    # fairseq's length penalty, the default, is left out of the key (cells scored before the key stay scored);
    # GNMT's form is another search: scored again, decoded with it
    assert "length_penalty_style" not in record["key"]["decode"]
    gnmt = load_grid(tmp_path / "grid.yaml", overrides=["decode.length_penalty_style=gnmt"], runs_dir=tmp_path / "runs")
    assert set(_statuses(gnmt).values()) == {"trained"}
    assert [o.error for o in run_grid(gnmt, gnmt.cells, log=lambda m: None)] == [None, None]
    record = json.loads((tmp_path / "runs" / "vanilla" / "seed-1" / "compare-eval.json").read_text())
    evaluated = json.loads((tmp_path / "runs" / "vanilla" / "seed-1" / "eval-averaged.json").read_text())
    assert record["key"]["decode"]["length_penalty_style"] == evaluated["test"]["decode"]["length_penalty_style"] \
        == "gnmt"
    assert set(_statuses(gnmt).values()) == {"evaluated"}


def _cell_archive(path, source, arc_dir, *, skip=(), extra=()):
    """A .tar.gz of the top-level files of ``source`` under ``arc_dir/`` (gpu_check's layout:
    ``results/compare/<grid dir>/<variant>/seed-<N>/<file>``), less ``skip``, plus ``extra`` names."""
    import tarfile
    with tarfile.open(path, "w:gz") as tar:
        for f in sorted(source.iterdir()):
            if f.is_file() and f.name not in skip and f.name != ".lock":
                tar.add(f, arcname=f"{arc_dir}/{f.name}")
        for name in extra:
            tar.add(next(p for p in source.iterdir() if p.is_file()), arcname=name)
    return path


def test_cells_trained_elsewhere_are_imported_whole_and_never_over_a_cell_begun_here(finished, tmp_path):
    """`sanlab compare GRID --import ARCHIVE` (scripts/gpu_check.sh's table1 cells): a finished, scored cell lands
    with every file; one that exists here, is locked by a run, lacks its score, or lies outside the grid does not."""
    import shutil

    grid, runs = finished, finished.runs_dir  # the cells' configs name the grid's own data files: used in place
    cell, other = grid.cells[2], grid.cells[3]
    backup = {c.run_dir: tmp_path / "backup" / c.run_dir.name for c in (cell, other)}
    for run_dir, copy in backup.items():
        shutil.copytree(run_dir, copy)
    try:
        _import_checks(grid, runs, cell, other, tmp_path)
    finally:  # the module's other tests read these cells: as they were
        for run_dir, copy in backup.items():
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.copytree(copy, run_dir)


def _import_checks(grid, runs, cell, other, tmp_path):
    import shutil

    from sanlab.experiments.importing import import_cells
    from sanlab.runs import run_lock
    arc = lambda c: f"results/compare/{runs.name}/{c.run_dir.relative_to(runs).as_posix()}"  # noqa: E731
    status = lambda c: _statuses(grid)[c.variant, c.seed]  # noqa: E731
    theirs = tmp_path / "elsewhere"
    shutil.move(cell.run_dir, theirs)  # as if trained on another machine
    archive = _cell_archive(tmp_path / "cells.tar.gz", theirs, arc(cell))
    assert status(cell) == "pending"
    logged = []
    assert [i.error for i in import_cells(grid, archive, log=logged.append)] == [None]
    assert status(cell) == "evaluated" and logged == [f"{cell.label}: imported"]
    assert sorted(p.name for p in cell.run_dir.iterdir() if p.name != ".lock") == \
        sorted(p.name for p in theirs.iterdir() if p.is_file() and p.name != ".lock")
    assert not list(runs.rglob(".import-*"))  # no staging left behind
    # again: the cell exists here now, and is left alone
    again = import_cells(grid, archive, log=lambda m: None)
    assert "exists here (begun or finished on this machine)" in again[0].error

    # files under another grid's directory stop the whole archive
    with pytest.raises(ConfigError, match="not files of cells of"):
        import_cells(grid, _cell_archive(tmp_path / "x.tar.gz", other.run_dir, "results/compare/x/1d-csan/seed-1"),
                     log=lambda m: None)
    # a cell this machine is training (its run lock held) is left alone
    archive2 = _cell_archive(tmp_path / "other.tar.gz", other.run_dir, arc(other))
    shutil.move(other.run_dir, tmp_path / "other-moved")
    with run_lock(other.run_dir):
        locked = import_cells(grid, archive2, log=lambda m: None)
    assert "being trained or evaluated by another process" in locked[0].error
    assert status(other) == "pending"
    # a cell without its score is not imported; a member outside the grid's cells stops the whole archive
    unscored = _cell_archive(tmp_path / "unscored.tar.gz", tmp_path / "other-moved", arc(other),
                             skip=("compare-eval.json",))
    assert "lacks compare-eval.json" in import_cells(grid, unscored, log=lambda m: None)[0].error
    assert status(other) == "pending"
    stray = _cell_archive(tmp_path / "stray.tar.gz", tmp_path / "other-moved", arc(other), extra=("../../etc/passwd",))
    with pytest.raises(ConfigError, match="nothing was imported"):
        import_cells(grid, stray, log=lambda m: None)
    assert status(other) == "pending"
    # nor does an archive cut short, one with two copies of a cell or a file twice, or a hidden file (.lock)
    whole = Path(archive2).read_bytes()
    (tmp_path / "cut.tar.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ConfigError, match=r"cannot read the archive \(.*\); nothing was imported"):
        import_cells(grid, tmp_path / "cut.tar.gz", log=lambda m: None)
    for extra, problem in ((f"copy/{arc(other)}/done.json", f"{other.label} is there 2 times"),
                           (f"{arc(other)}/done.json", f"{other.label} has done.json more than once"),
                           (f"{arc(other)}/.lock", "not files of cells of")):
        bad = _cell_archive(tmp_path / "bad.tar.gz", tmp_path / "other-moved", arc(other), extra=(extra,))
        with pytest.raises(ConfigError, match=problem):
            import_cells(grid, bad, log=lambda m: None)
    assert status(other) == "pending" and [p.name for p in other.run_dir.iterdir()] == [".lock"]  # the lock above
    # a name no run writes is not a cell's file; a file of the user's where the cell would land is never written over
    # (nor taken out with the cell's own on a refusal)
    odd = _cell_archive(tmp_path / "odd.tar.gz", tmp_path / "other-moved", arc(other), extra=(f"{arc(other)}/notes.txt",))
    assert "the archive holds files no run writes (notes.txt)" in import_cells(grid, odd, log=lambda m: None)[0].error
    (other.run_dir / "notes.txt").write_text("mine\n")
    assert "holds files here (notes.txt); to import the archive's cell, move them away first" in \
        import_cells(grid, archive2, log=lambda m: None)[0].error
    assert (other.run_dir / "notes.txt").read_text() == "mine\n"
    (other.run_dir / "notes.txt").unlink()
    # a done.json not of the form sanlab writes: a conflict once unpacked, so taken out again (not a traceback)
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "other-moved", damaged)
    done = json.loads((damaged / "done.json").read_text())
    (damaged / "done.json").write_text(json.dumps({k: v for k, v in done.items() if k != "config"}))
    refused = import_cells(grid, _cell_archive(tmp_path / "damaged.tar.gz", damaged, arc(other)), log=lambda m: None)
    assert "not a record of a finished cell" in refused[0].error and "taken out again" in refused[0].error
    assert [p.name for p in other.run_dir.iterdir()] == [".lock"] and status(other) == "pending"
    # a failure recorded here before the cell trained elsewhere (gpu_check's table1 flow) does not stop it, and
    # is over once the cell is imported
    (other.run_dir / "failed.json").write_text('{"error": "DataError: no data here"}')
    assert [i.error for i in import_cells(grid, archive2, log=lambda m: None)] == [None]
    assert not (other.run_dir / "failed.json").exists()
    assert status(other) == "evaluated"
    # the command: the table follows, and a cell left out makes it exit 1, saying why
    printed = []
    assert run_compare(str(SMOKE), overrides=TINY, runs_dir=str(runs), imports=[str(archive2)],
                       command="sanlab compare smoke --import", out=printed.append) == 1
    assert "- cells done: 4 of 4" in printed[0]
    assert printed[-1].startswith(f"NOT IMPORTED {other.label} from {archive2}: ") and "exists here" in printed[-1]
    with pytest.raises(ConfigError, match="--import adds cells and prints the table"):
        run_compare(str(SMOKE), overrides=TINY, runs_dir=str(runs), imports=[str(archive2)], table_only=True)
    with pytest.raises(ConfigError, match="--import brings in every cell of the archive .* --only, --dataset and"):
        run_compare(str(SMOKE), overrides=TINY, runs_dir=str(runs), imports=[str(archive2)], only=["1D-CSAN"])


def test_dry_run_estimates_the_updates_left_from_the_cells_trained_here(finished):
    """``--dry-run`` ends with the time the remaining updates take at the speed of the cells trained on this
    machine, by variant; nothing left (or nothing trained here), no estimate."""
    from sanlab.experiments.cells import last_speed
    from sanlab.experiments.running import time_left

    assert time_left(finished, finished.cells) is None  # all evaluated
    longer = load_grid(SMOKE, overrides=[*TINY, "train.max_steps=400000"], runs_dir=finished.runs_dir)
    assert set(_statuses(longer).values()) == {"training"}  # the budget grew: 399,996 more steps each
    speeds = {c.variant: [] for c in finished.cells}
    for c in finished.cells:
        speeds[c.variant].append(last_speed(c.run_dir)["steps_per_s"])
    seconds = sum(399_996 / (sum(v) / 2) for v in speeds.values() for _ in v)  # the median of two is their mean
    minutes = round(seconds / 60)
    expected = f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
    assert time_left(longer, longer.cells) == (
        f"about {expected} of updates left for 4 cells, one at a time, at the speed of the 4 cells trained one at a "
        "time on this machine (by variant where there are some); validation and evaluation come on top")
    listing = describe_cells(longer, longer.cells).splitlines()
    assert listing[-1] == time_left(longer, longer.cells)
    for cell, line in zip(longer.cells, listing):  # each cell's own share, at its variant's speed
        minutes = round(399_996 / (sum(speeds[cell.variant]) / 2) / 60)
        own = f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
        assert line.startswith(cell.label) and line.endswith(f"  ~{own} of updates"), line
    assert not any("of updates" in line for line in describe_cells(finished, finished.cells).splitlines())
    # a process training a cell logs past its last checkpoint: the listing says how far (a resume starts earlier)
    cell = longer.cells[0]
    with open(cell.layout.metrics, "a", encoding="utf-8") as f:
        f.write(json.dumps({"split": "train", "step": 1_234, "time": 1_795_914_061.9, "loss": 1.0}) + "\n")
    line = describe_cells(longer, longer.cells).splitlines()[0]
    assert f"{cell.label}  training step 4 (its log has reached update 1,234, 2026-11-29 01:01 UTC)" in line, line


def test_an_estimate_under_a_minute_says_so():
    from sanlab.experiments.running import _about

    assert [_about(s, "~") for s in (0.4, 29, 31, 90, 3900)] == [
        "under a minute", "under a minute", "~1 min", "~2 min", "~1 h 05 min"]


def test_dry_run_estimate_stops_at_max_epochs_prefers_cells_trained_alone_and_skips_damaged_ones(finished, tmp_path):
    """Updates per epoch come from where finished cells stopped, so ``max_epochs`` caps a cell's steps; with early
    stopping the estimate is an upper bound ("at most"); speeds of cells trained side by side (``--jobs``) are
    used only where no cell trained alone; a cell whose files cannot be read is left out, not an error."""
    import shutil

    from sanlab.experiments.cells import last_speed
    from sanlab.experiments.running import time_left

    runs = tmp_path / "runs"
    shutil.copytree(finished.runs_dir, runs)
    pending, alone_a, alone_b, side_b = load_grid(SMOKE, overrides=TINY, runs_dir=runs).cells
    assert pending.variant == alone_a.variant and alone_b.variant == side_b.variant != pending.variant
    shutil.rmtree(pending.run_dir)
    for cell, jobs in ((alone_a, 1), (alone_b, 1), (side_b, 2)):
        done = read_json(cell.layout.done)
        done["summary"].update(step=4, epoch=2, position=0)  # two updates an epoch
        cell.layout.done.write_text(json.dumps({**done, "jobs": jobs}), encoding="utf-8")
    # patience 3 (a tighter one than the finished cells': they are conflicts now, but their speeds still count)
    grid = load_grid(SMOKE, overrides=[*TINY, "train.max_steps=400000", "train.patience=3"], runs_dir=runs)
    speed = last_speed(alone_a.run_dir)["steps_per_s"]
    seconds = 1000 * 2 / speed  # max_epochs 1000 x 2 updates, not max_steps' 400,000
    minutes = round(seconds / 60)
    duration = f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
    cell_estimate, grid_estimate = (("under a minute",) * 2 if seconds < 30  # a fast machine's smoke cells
                                    else (f"~{duration}", f"about {duration}"))
    line = next(line for line in describe_cells(grid, grid.cells).splitlines() if line.startswith(pending.label))
    assert line.endswith(f"  at most {cell_estimate} of updates"), line
    assert time_left(grid, grid.cells) == (
        f"at most {grid_estimate} of updates left for 1 cell, one at a time, at the speed of the 2 cells trained "
        "one at a time on this machine (by variant where there are some); validation and evaluation come on top; "
        "early stopping (train.patience) may end cells sooner")
    for cell in (alone_a, alone_b):
        done = read_json(cell.layout.done)
        cell.layout.done.write_text(json.dumps({**done, "jobs": 2}), encoding="utf-8")
    assert "at the speed of the 3 cells trained side by side (each slower than alone) on this" in time_left(
        grid, grid.cells)
    alone_a.layout.done.write_text("{", encoding="utf-8")  # damaged: left out of the estimate, not an error
    assert "at the speed of the 2 cells trained side by side" in describe_cells(grid, grid.cells).splitlines()[-1]


def test_a_cells_line_shows_a_time_under_a_second_true(tmp_path):
    """A cell evaluated in 0.4 s was reported "(0s)"; the shared duration formatter gives it a tenth."""
    from sanlab.experiments.cells import CellOutcome
    from sanlab.experiments.running import outcome_line

    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    cell = grid.cells[0]
    evaluated = CellOutcome(cell, trained=False, evaluated=True, seconds=0.4)
    assert outcome_line(evaluated, done=1, total=3) == f"[1/3] {cell.label}: evaluated (0.4s)"
    failed = CellOutcome(cell, trained=True, evaluated=False, seconds=0.01, error="boom")
    assert outcome_line(failed, done=2, total=3) == f"[2/3] {cell.label}: FAILED: boom (<0.1s)"


@pytest.mark.slow  # three cells' training and evaluation: ~12 s
def test_stop_after_leaves_the_cell_it_cut_resumable_begins_no_other_and_fails_none(tmp_path, monkeypatch, capsys):
    """``sanlab compare --stop-after``: the clock is a stand-in advancing one second a look (a look before each
    cell, after each update, before each evaluation), so the limit falls on update 3 of the first cell (its
    validations are at 2 and 4); the second cell is not begun. Both are reported, neither as failed, and the
    exit status is 0; the next invocation resumes the first and runs the second."""
    import itertools
    import types

    import torch

    from sanlab.training import stop_after as stop_after_module
    from sanlab.training.stop_after import StopAfter

    torch.set_num_threads(1)
    ticks = itertools.count()
    monkeypatch.setattr(stop_after_module, "time", types.SimpleNamespace(monotonic=lambda: float(next(ticks))))
    compare = dict(overrides=TINY, runs_dir=str(tmp_path), only=["1D-CSAN"], quiet=True, command="test")
    assert run_compare(str(SMOKE), **compare, stop_after=StopAfter("3s", deadline_mono=3.0)) == 0
    printed = capsys.readouterr()
    said = printed.err
    assert "[1/2] 1D-CSAN / seed 0: stopped at update 3 of 4 by --stop-after 3s; resumable (" in said, said
    assert "[2/2] 1D-CSAN / seed 1: not begun: past --stop-after 3s (" in said and "FAILED" not in said
    assert printed.out.rstrip().splitlines()[-1] == ("NOT FINISHED: 2 cell(s) left by --stop-after 3s, resumable (run "
                                                     "the same command again): 1D-CSAN / seed 0, 1D-CSAN / seed 1")
    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    first, second = select_cells(grid, only=["1D-CSAN"])
    assert cell_state(first, grid.spec.eval).step == 3 and cell_state(first, grid.spec.eval).status == "training"
    assert not first.layout.done.exists() and not first.layout.failed.exists()
    assert cell_state(second, grid.spec.eval).status == "pending"
    with pytest.raises(ConfigError, match="--stop-after with --table-only, which trains no cell"):
        run_compare(str(SMOKE), overrides=TINY, runs_dir=str(tmp_path), table_only=True,
                    stop_after=StopAfter("3s", deadline_mono=3.0))
    assert run_compare(str(SMOKE), **compare) == 0
    assert _statuses(grid, [first, second]) == {("1D-CSAN", 0): "evaluated", ("1D-CSAN", 1): "evaluated"}
    assert "resumed from" in (first.run_dir / "train.log").read_text()


# ----------------------------------------------------------------------------- --stop-after, fast
def _past_the_limit():
    from sanlab.training.stop_after import StopAfter

    return StopAfter("3s", deadline_mono=0.0)  # reached at the first look


@pytest.mark.parametrize("status, step, said", [
    ("pending", None, "not begun: past --stop-after 3s"),
    ("training", 2, "not resumed: past --stop-after 3s"),  # trained partway by an earlier invocation
    ("trained", 4, "trained, not evaluated: past --stop-after 3s")])
def test_a_cell_reached_after_the_limit_is_reported_as_it_is(tmp_path, monkeypatch, status, step, said):
    from sanlab.experiments.cells import run_cell
    from sanlab.experiments.grid_state import CellState
    from sanlab.experiments.running import outcome_line

    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    cell = grid.cells[0]
    monkeypatch.setattr(cells_module, "cell_state", lambda c, spec: CellState(status, step=step))
    monkeypatch.setattr(cells_module, "train_cell", lambda *a, **k: pytest.fail("trained past the limit"))
    monkeypatch.setattr(cells_module, "evaluate_cell", lambda *a, **k: pytest.fail("evaluated past the limit"))
    outcome = run_cell(cell, grid.spec.eval, quiet=True, stop_after=_past_the_limit())
    assert (outcome.trained, outcome.evaluated, outcome.error, outcome.stopped) == (False, False, None, said)
    assert outcome_line(outcome, done=1, total=2) == f"[1/2] {cell.label}: {said} (<0.1s)"


def test_a_cell_that_turned_conflict_during_the_grid_is_not_called_not_begun(tmp_path, monkeypatch):
    """``run_cell`` looks again at its turn (another invocation may have written the directory meanwhile): past the
    limit, a conflict is still a refusal, not "not begun"."""
    from sanlab.experiments.cells import run_cell
    from sanlab.experiments.grid_state import CellState

    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    cell = grid.cells[0]
    monkeypatch.setattr(cells_module, "cell_state", lambda c, spec: CellState("conflict", None, "other values",
                                                                               advice=""))
    outcome = run_cell(cell, grid.spec.eval, quiet=True, stop_after=_past_the_limit())
    assert (outcome.error, outcome.stopped) == (f"ConfigError: {cell.run_dir}: other values", None)


def test_a_cell_trained_here_then_past_the_limit_reads_trained_once(tmp_path, monkeypatch):
    """Trained in this invocation, and the limit passed at its end: "trained, not evaluated", once."""
    from sanlab.experiments.cells import run_cell
    from sanlab.experiments.grid_state import CellState
    from sanlab.experiments.running import outcome_line
    from sanlab.training.stop_after import StopAfter

    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    cell = grid.cells[0]
    limit = StopAfter("3s", deadline_mono=float("inf"))
    monkeypatch.setattr(cells_module, "cell_state", lambda c, spec: CellState("pending"))

    def train(*args, **kwargs):
        object.__setattr__(limit, "deadline_mono", 0.0)  # the limit passes during the cell's last update
        return {"step": 4}

    monkeypatch.setattr(cells_module, "train_cell", train)
    monkeypatch.setattr(cells_module, "evaluate_cell", lambda *a, **k: pytest.fail("evaluated past the limit"))
    outcome = run_cell(cell, grid.spec.eval, quiet=True, stop_after=limit)
    assert (outcome.trained, outcome.evaluated, outcome.error) == (True, False, None)
    line = outcome_line(outcome, done=1, total=1)
    assert line == f"[1/1] {cell.label}: trained, not evaluated: past --stop-after 3s (<0.1s)"
    cut = cells_module.CellOutcome(cell, True, False, 0.01, stopped="stopped at update 3 of 4 by --stop-after 3s; "
                                                                    "resumable")
    assert outcome_line(cut, done=1, total=1) == (f"[1/1] {cell.label}: stopped at update 3 of 4 by --stop-after "
                                                  "3s; resumable (<0.1s)")


def test_a_cell_its_epochs_bound_says_where_it_stopped_in_epochs(tmp_path, monkeypatch):
    """The tagging grids end their cells at train.max_epochs, train.max_steps left at its default 100,000: "update 4
    of 100,000" told nothing. 1,000 sentences in batches of 32 are 32 updates an epoch; the limit falls on update 4
    (the stand-in clock reads 0, 1, 2, 3 after updates 1 to 4)."""
    import itertools
    import types

    from sanlab.training import stop_after as stop_after_module
    from sanlab.training.stop_after import StopAfter

    bounds = [o for o in TINY if not o.startswith(("train.max_steps=", "train.max_epochs="))]
    grid = load_grid(SMOKE, overrides=[*bounds, "train.max_epochs=2"], runs_dir=tmp_path)
    assert grid.cells[0].config.train.max_steps == 100_000  # the recipe's default
    cells_module.prepare_synthetic(grid)
    ticks = itertools.count()
    monkeypatch.setattr(stop_after_module, "time", types.SimpleNamespace(monotonic=lambda: float(next(ticks))))
    done = cells_module.train_cell(grid.cells[0], quiet=True, spec=grid.spec.eval,
                                   stop_after=StopAfter("3s", deadline_mono=3.0))
    assert done == {"stopped": "stopped at update 4 (0 of 2 epochs done) by --stop-after 3s; resumable"}


def test_a_conflict_is_reported_at_once_whatever_the_limit(tmp_path, capsys):
    """A cell whose run directory holds a run with other settings is a conflict (a refusal: FAILED, exit 1). The
    grid looks at every cell before it trains any, so the conflict is said then, first, even where the limit would
    have come before its turn (it was "not begun" and exit 0: the conflict showed only at the next invocation)."""
    from sanlab.config import dump_config
    from sanlab.experiments.running import run_order

    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    last = run_order(grid, grid.cells)[-1]  # the cell the grid would reach last
    other = load_grid(SMOKE, overrides=[*TINY, "model.word_dim=16"], runs_dir=tmp_path)
    last.run_dir.mkdir(parents=True)
    last.layout.config.write_text(dump_config(next(c for c in other.cells if c.run_dir == last.run_dir).config))
    assert cell_state(last, grid.spec.eval).status == "conflict"
    assert run_compare(str(SMOKE), overrides=TINY, runs_dir=str(tmp_path), command="test",
                       stop_after=_past_the_limit()) == 1
    printed = capsys.readouterr()
    lines = printed.err.splitlines()
    refused = f"FAILED: ConfigError: {last.run_dir}: the directory holds a run with other values of: model.word_dim"
    assert lines[1].startswith(f"[1/{len(grid.cells)}] {last.label}: {refused}"), lines
    assert [line.split(": ", 1)[1].rsplit(" (", 1)[0] for line in lines[2:]] == \
        ["not begun: past --stop-after 3s"] * (len(grid.cells) - 1)
    out = printed.out.rstrip().splitlines()
    assert out[-2].startswith(f"FAILED {last.label}: ConfigError: {last.run_dir}: the directory holds a run")
    assert out[-1].startswith(f"NOT FINISHED: {len(grid.cells) - 1} cell(s) left by --stop-after 3s")
    assert not last.layout.failed.exists()  # a refusal writes nothing into the cell


@pytest.mark.parametrize("mode", ["table_only", "dry_run", "rescore"])
def test_stop_after_with_a_mode_that_trains_nothing_is_refused(tmp_path, mode):
    with pytest.raises(ConfigError, match=f"--stop-after with --{mode.replace('_', '-')}, which trains no cell"):
        run_compare(str(SMOKE), overrides=TINY, runs_dir=str(tmp_path), stop_after=_past_the_limit(), **{mode: True})


def test_the_cells_the_limit_left_are_listed_again_at_the_end(tmp_path, monkeypatch, capsys):
    """Like FAILED cells, those --stop-after left are named after the table, so an incomplete grid shows at the
    end; the exit status stays 0."""
    from sanlab.experiments import compare as compare_module

    grid = load_grid(SMOKE, overrides=TINY, runs_dir=tmp_path)
    left = [cells_module.CellOutcome(c, False, False, 0.0, stopped="not begun: past --stop-after 3s")
            for c in grid.cells]
    monkeypatch.setattr(compare_module, "run_grid", lambda grid, cells, **kwargs: left)
    assert run_compare(str(SMOKE), overrides=TINY, runs_dir=str(tmp_path), command="test",
                       stop_after=_past_the_limit()) == 0
    out = capsys.readouterr().out.rstrip().splitlines()
    labels = ", ".join(c.label for c in grid.cells)
    assert out[-1] == (f"NOT FINISHED: {len(grid.cells)} cell(s) left by --stop-after 3s, resumable (run the same "
                       f"command again): {labels}")
