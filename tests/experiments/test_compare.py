"""``sanlab compare``: grid loading and its errors, cell states, running / reusing / resuming cells,
the aggregation (mean ± sd, majority significance marks) and the rendered table.

End-to-end tests run the shipped smoke grid (configs/compare/smoke-synthetic.yaml, a synthetic
tagging corpus) shrunk further by ``--set`` so each cell trains for a handful of steps.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from sanlab.errors import ConfigError, TrainingError
from sanlab.evaluation.significance import paired_bootstrap_accuracy
from sanlab.experiments import cells as cells_module
from sanlab.experiments.cells import CellResult, speed_conditions
from sanlab.experiments.compare import (
    build_report, build_section, describe_cells, majority_mark, paired_test, run_compare, run_grid, run_order,
    select_cells,
)
from sanlab.experiments.grid import cell_state, load_grid
from sanlab.files import read_json
from sanlab.experiments.tables import Report, Stat, format_stat, render_csv, render_markdown, section_markdown
from sanlab.runs import git_revision, train_run

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "configs" / "compare" / "smoke-synthetic.yaml"
TINY = ["model.word_dim=8", "model.char_dim=4", "model.char_filters=4", "model.encoder.layers=1",
        "train.batch_size=32", "train.max_steps=4", "train.valid_every=2", "train.max_epochs=1000",
        "train.keep_best=1", "train.keep_last=1"]
TAGGER = """\
task: tagging
data: {train: t.conllu, dev: d.conllu}
model: {word_dim: 8, char_dim: 4, char_filters: 4, char_layers: 1, encoder: {layers: 1}}
"""


def _statuses(grid, cells=None) -> dict[tuple[str, int], str]:
    return {(c.variant, c.seed): cell_state(c, grid.spec.eval).status for c in cells or grid.cells}


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- aggregation by hand
def test_mean_and_sample_sd_by_hand():
    stat = Stat((1.0, 2.0, 4.0))
    # mean 7/3; squared deviations 16/9 + 1/9 + 25/9 = 42/9; / (n - 1) = 7/3
    assert stat.mean == pytest.approx(7 / 3) and stat.sd == pytest.approx(math.sqrt(7 / 3))
    assert Stat((5.0,)).sd is None and Stat(()).mean is None
    assert format_stat(Stat((90.0, 92.0))) == "91.00 ± 1.41" and format_stat(Stat((5.0,))) == "5.00"


@pytest.mark.parametrize("marks, expected", [
    ([], ("", 0)), (["⇑"], ("⇑", 1)), ([""], ("", 0)),
    (["⇑", "↑", ""], ("↑", 2)),        # 2 of 3 upwards, only 1 of 3 at p < 0.01
    (["⇑", "⇑", "↑"], ("⇑", 3)),
    (["⇑", ""], ("", 0)),              # 1 of 2 is no majority
    (["↓", "⇓", "↑"], ("↓", 2)),
])
def test_majority_mark(marks, expected):
    assert majority_mark(marks) == expected


def _hand_grid(tmp_path):
    _write(tmp_path / "tagger.yaml", TAGGER)
    return load_grid(_write(tmp_path / "g.yaml", """\
base: tagger.yaml
seeds: [1, 2]
variants:
  - {name: base, paper: {All: 92.4}}
  - {name: better, overrides: {model.encoder.attention.parts: [{type: temperature}]}, paper: {All: 92.49}}
  - {name: same, seeds: [1, 2, 3]}
eval: {bootstrap_samples: 200}
"""), runs_dir=tmp_path / "runs")


def test_section_from_known_per_seed_numbers(tmp_path):
    grid = _hand_grid(tmp_path)
    wrong_half = [[i % 2 == 0] * 5 for i in range(40)]     # 20 of 40 sentences all wrong
    right = [[True] * 5 for _ in range(40)]

    def cell(variant, seed, score, evidence, *, params, steps):
        return CellResult(variant, seed, params=params, speed={"steps_per_s": steps, "tokens_per_s": 100 * steps},
                          scores={"all": score, "oov": None, "ambiguous": score - 10}, evidence=evidence)

    results = {("base", 1): cell("base", 1, 90.0, wrong_half, params=1000, steps=2.0),
               ("base", 2): cell("base", 2, 92.0, wrong_half, params=1000, steps=4.0),
               ("better", 1): cell("better", 1, 95.0, right, params=1048, steps=1.0),
               ("better", 2): cell("better", 2, 97.0, right, params=1048, steps=2.0),
               ("same", 1): cell("same", 1, 90.0, wrong_half, params=1000, steps=2.0)}
    section = build_section(grid, dataset=None, results=results, references=None)
    base, better, same = section.rows
    assert (section.done, section.total) == (5, 7) and section.partial
    assert base.baseline and base.mark == "" and base.tests == () and base.delta is None
    assert base.scores["All"].mean == 91.0 and base.scores["All"].sd == pytest.approx(math.sqrt(2))
    assert base.scores["OOV"].n == 0  # an empty OOV subset is no value, not a zero
    assert better.delta == pytest.approx(5.0) and better.params_delta == 48
    assert better.steps_per_s.mean == 1.5 and better.steps_delta == pytest.approx(-1.5)
    # every sentence right vs half of them wrong: each seed's bootstrap says p < 0.01, upwards
    expected = paired_bootstrap_accuracy(wrong_half, right, n_samples=200, seed=12345)
    assert [t.p_value for t in better.tests] == [expected.p_value] * 2 and expected.p_value < 0.01
    assert (better.mark, better.mark_support) == ("⇑", 2)
    # over both seeds of both rows: each row's runs are alike, so no seed variation and the paired test's p;
    # two seeds a side give the p but no mark (SEEDS_FOR_A_MARK)
    assert better.seeds_test.p_value == expected.p_value and better.seeds_test.mark == ""
    assert (better.seeds_test.seeds, better.seeds_test.baseline_seeds) == ((1, 2), (1, 2))
    assert better.seeds_test.delta == pytest.approx(100.0 - 50.0)  # from the evidence, not the stored scores
    assert same.seeds_test is None  # one seed shows no seed variation
    assert same.seeds_done == (1,) and same.seeds_planned == (1, 2, 3)
    assert [t.p_value for t in same.tests] == [1.0] and same.mark == ""  # identical output: no difference
    assert section.paper_columns == ("All",) and better.paper == {"All": 92.49}
    # the paper's own Δ (92.49 - 92.40) is below PAPER_DELTA_FLOOR: no sign to agree with; no number, no verdict
    assert section.paper_delta_column == "All" and section.paper_delta(better) == pytest.approx(0.09)
    assert section.direction(better) == "paper ≈ 0" and section.direction(same) == "" and section.direction(base) == ""
    # a paper Δ of +0.6: ours agrees when significant; the seeds test decides where there is one
    def direction(row):
        return replace(section, rows=(base, row)).direction(row)

    shown = replace(better, paper={"All": 93.0})
    assert direction(shown) == "same"  # the seeds test has 2 seeds a side, too few to decide: ⇑ 2/2 does
    assert direction(replace(shown, delta=-5.0, mark="⇓")) == "opposite"
    assert direction(replace(shown, mark="")) == "n.s."
    three = replace(shown.seeds_test, seeds=(1, 2, 3), baseline_seeds=(1, 2, 3))
    assert direction(replace(shown, seeds_test=replace(three, mark=""))) == "n.s."  # 3 a side: the seeds test decides
    assert direction(replace(shown, seeds_test=replace(three, mark="↑"), mark="")) == "same"
    assert direction(replace(shown, paper={"All": 92.50})) == "same"  # +0.10 as printed is not below the floor
    table = "\n".join(render_markdown(build_report(grid, command="test")).splitlines())
    assert "**Partial table: 0 of 7 cells done.**" in table  # nothing on disk for the real grid


def test_markdown_and_csv_rows(tmp_path):
    grid = _hand_grid(tmp_path)
    flags = [[True, False]] * 10
    results = {(v, s): CellResult(v, s, params=1000, speed={"steps_per_s": 2.0, "tokens_per_s": 50.0},
                                  scores={"all": 50.0, "oov": 25.0, "ambiguous": 40.0}, evidence=flags)
               for v in ("base", "better") for s in (1, 2)}
    section = build_section(grid, dataset=None, results=results, references=None)
    md = render_markdown(Report(title="t", header={"grid": "g"}, sections=(section,)))
    lines = [line for line in md.splitlines() if line.startswith("|")]
    assert lines[0].split(" | ")[6:10] == ["All", "Δ All", "sig.", "sig. (seeds)"]  # both rows have 2 seeds
    assert lines[0].endswith("| paper All | paper Δ All | direction |")
    assert lines[2].startswith("| base (baseline) | 2/2 | 1,000 |  | 2.00 | 50 | 50.00 ± 0.00 |  |  | ")
    assert lines[3].startswith("| better | 2/2 | 1,000 | +0 | 2.00 (+0.00) | 50 | 50.00 ± 0.00 | +0.00 |  | p = 1.00 |")
    assert lines[3].endswith("| 92.49 | +0.09 | paper ≈ 0 |")  # the paper's own Δ is below PAPER_DELTA_FLOOR
    assert lines[4].startswith("| same | 0/3 | — |")
    csv = render_csv(Report(title="t", header={}, sections=(section,))).splitlines()
    assert csv[0].startswith("dataset,variant,baseline,seeds_done") and len(csv) == 4
    assert ",seeds_test_mark,seeds_test_p," in csv[0] and ",,1.0," in csv[2]


def test_speeds_measured_otherwise_than_the_baselines_get_no_delta(tmp_path):
    grid = _hand_grid(tmp_path)

    def cell(variant, seed, steps, conditions):
        return CellResult(variant, seed, params=1000, speed={"steps_per_s": steps, "tokens_per_s": 10 * steps},
                          conditions=conditions)

    results = {("base", 1): cell("base", 1, 2.0, "1 job x 2 threads"),
               ("better", 1): cell("better", 1, 1.0, "2 jobs x 1 thread"),
               ("same", 1): cell("same", 1, 1.5, "1 job x 2 threads")}
    section = build_section(grid, dataset=None, results=results, references=None)
    base, better, same = section.rows
    assert not better.speed_comparable and better.steps_delta is None and better.steps_per_s.mean == 1.0
    assert same.speed_comparable and same.steps_delta == pytest.approx(-0.5)
    rows = {line.split(" | ")[0]: line.split(" | ")[4] for line in section_markdown(section) if line.startswith("| ")}
    assert rows["| better"] == "1.00 (†)" and rows["| same"] == "1.50 (−0.50)"
    assert render_csv(Report(title="t", header={}, sections=(section,))).splitlines()[2].split(",")[11] == \
        "2 jobs x 1 thread"


def test_speed_conditions_of_cells_finished_before_done_json_recorded_jobs(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"command": ["sanlab", "compare", "g.yaml", "--jobs", "2"]}))
    assert speed_conditions(tmp_path, {"threads": 1}) == "2 jobs x 1 thread"
    # created by a --jobs 2 grid, finished alone: both sessions count
    assert speed_conditions(tmp_path, {"threads": 2, "jobs": 1}) == "mixed (2 jobs x 2 threads; 1 job x 2 threads)"
    # meta.json's "threads" of runs from before sessions were recorded is not trusted (read too early)
    (tmp_path / "meta.json").write_text(json.dumps({"command": ["sanlab", "compare", "g.yaml", "--jobs=3"]}))
    assert speed_conditions(tmp_path, {"threads": 1}) == "3 jobs x 1 thread"
    # started alone, finished side by side (a resumed cell): its speed averages both, so it is "mixed"
    (tmp_path / "meta.json").write_text(json.dumps({"command": ["sanlab", "train", "c.yaml"], "threads": 2}))
    assert speed_conditions(tmp_path, {"threads": 1, "jobs": 2}) == "mixed (1 job x 1 thread; 2 jobs x 1 thread)"


def test_speed_conditions_follow_every_training_session(tmp_path):
    sessions = [{"command": ["sanlab", "compare", "g.yaml", "--jobs", "2"], "threads": 1},  # before "jobs" was kept
                {"command": ["sanlab", "compare", "g.yaml"], "threads": 1, "jobs": 2}]
    (tmp_path / "meta.json").write_text(json.dumps({"command": sessions[0]["command"], "sessions": sessions}))
    assert speed_conditions(tmp_path, {"threads": 1, "jobs": 2}) == "2 jobs x 1 thread"
    sessions.append({"command": ["sanlab", "compare", "g.yaml"], "threads": 2, "jobs": 1})
    (tmp_path / "meta.json").write_text(json.dumps({"command": sessions[0]["command"], "sessions": sessions}))
    assert speed_conditions(tmp_path, {"threads": 2, "jobs": 1}) == "mixed (2 jobs x 1 thread; 1 job x 2 threads)"
    # created before sessions were recorded (alone), resumed side by side: the creating command counts
    resumed = [{"command": ["sanlab", "compare", "g.yaml", "--jobs", "2"], "threads": 1, "from_step": 2750}]
    (tmp_path / "meta.json").write_text(json.dumps({"command": ["sanlab", "compare", "g.yaml"], "sessions": resumed}))
    assert speed_conditions(tmp_path, {"threads": 1, "jobs": 2}) == "mixed (1 job x 1 thread; 2 jobs x 1 thread)"


def test_speed_conditions_name_the_device_precision_and_compilation(tmp_path):
    """A speed measured on a GPU, in bf16 or compiled is not comparable with a CPU fp32 eager one: the
    conditions say so (and stay as they were for CPU fp32 eager runs and for sessions recorded before)."""
    old = {"command": ["sanlab", "compare", "g.yaml"], "threads": 1, "jobs": 1}  # no device: the CPU
    gpu = {**old, "device": "cuda (NVIDIA H100 80GB HBM3)", "precision": "bf16", "compile": True}
    cpu = {**old, "device": "cpu", "precision": "fp32", "compile": False}

    def conditions(sessions, config=None):
        (tmp_path / "meta.json").write_text(json.dumps({"command": old["command"], "sessions": sessions}))
        return speed_conditions(tmp_path, {"threads": 1, "jobs": 1, "config": config or {}})

    assert conditions([old]) == conditions([cpu]) == "1 job x 1 thread"
    assert conditions([gpu]) == "1 job x 1 thread, cuda (NVIDIA H100 80GB HBM3), bf16, compiled"
    assert conditions([old, gpu]) == \
        "mixed (1 job x 1 thread; 1 job x 1 thread, cuda (NVIDIA H100 80GB HBM3), bf16, compiled)"
    # a session from before precision was recorded trained in the precision the run finished with
    assert conditions([old], {"train": {"bf16": True}}) == "1 job x 1 thread, bf16"
    # ... and on the device it names, where that is a GPU (auto: the CPU, where every run of that time trained)
    assert conditions([old], {"train": {"device": "cuda:1"}}) == "1 job x 1 thread, cuda:1"
    assert conditions([old], {"train": {"device": "auto"}}) == "1 job x 1 thread"


def test_a_baseline_trained_under_mixed_conditions_gives_no_speed_delta(tmp_path):
    grid = _hand_grid(tmp_path)

    def cell(variant, conditions):
        return CellResult(variant, 1, params=1000, speed={"steps_per_s": 1.0, "tokens_per_s": 10.0},
                          conditions=conditions)

    mixed = "mixed (1 job x 2 threads; 2 jobs x 1 thread)"
    section = build_section(grid, dataset=None, results={("base", 1): cell("base", mixed),
                                                         ("better", 1): cell("better", mixed)}, references=None)
    assert [(r.speed_comparable, r.steps_delta) for r in section.rows[:2]] == [(False, None), (False, None)]


def test_cells_scored_on_other_sentences_are_not_paired(tmp_path):
    grid = _hand_grid(tmp_path)
    flags = [[True, False]] * 10

    def cell(variant, gold):
        return CellResult(variant, 1, params=1000, scores={"all": 50.0, "oov": None, "ambiguous": None},
                          evidence=flags, scored_against=gold)

    section = build_section(grid, dataset=None, results={("base", 1): cell("base", "a"),
                                                         ("better", 1): cell("better", "b")}, references=None)
    better = section.rows[1]  # the row keeps its scores, gets no test, and the table says why
    assert better.tests == () and better.mark == "" and better.scores["All"].mean == 50.0
    assert "'better' seed 1 was scored on other sentences than the baseline 'base'" in better.problem
    assert better.delta is None and section.direction(better) == ""
    md = section_markdown(section)
    assert any(line.startswith("| better (‡) | 1/2 |") for line in md)
    assert any(line.startswith("- (‡) better: no test against the baseline: 'better' seed 1") for line in md)


def test_failed_cells_are_counted_and_named_in_the_table(tmp_path):
    grid = _hand_grid(tmp_path)
    results = {("base", 1): CellResult("base", 1, params=1000, scores={"all": 50.0, "oov": None, "ambiguous": None},
                                       evidence=[[True, False]] * 10)}
    section = build_section(grid, dataset=None, results=results, references=None,
                            failures={("better", 2): "TrainingError: loss is nan at update 7 (epoch 0)"})
    assert section.rows[1].seeds_failed == (2,)
    md = section_markdown(section)
    assert any(line.startswith("| better | 0/2 (1 failed) |") for line in md)
    assert "- FAILED better / seed 2: TrainingError: loss is nan at update 7 (epoch 0)" in md
    csv = render_csv(Report(title="t", header={}, sections=(section,))).splitlines()
    assert csv[0].split(",")[7] == "seeds_failed" and csv[2].split(",")[7] == "1"


def test_translation_cells_scored_against_other_references_are_not_paired(tmp_path, monkeypatch):
    from sanlab.experiments import compare_report as compare  # where collect reads the results

    _write(tmp_path / "mt.yaml", "task: translation\ndata: {train: {src: x, tgt: x}, valid: {src: x, tgt: x}, "
                                 "test: {t: {src: a.src, tgt: a.tgt}}}\n")
    grid = load_grid(_write(tmp_path / "g.yaml", "base: mt.yaml\nseeds: [1]\nvariants:\n  - {name: a}\n"
                                                 "  - {name: b, overrides: [data.test.t.tgt=b.tgt]}\n"),
                     runs_dir=tmp_path / "runs")
    monkeypatch.setattr(compare, "read_result", lambda cell, spec: CellResult(
        cell.variant, cell.seed, scores={"bleu": 1.0, "chrf": 1.0}, evidence=["x"],
        scored_against=cells_module.reference_file(cell)))
    monkeypatch.setattr(compare, "read_references", lambda cell: [f"references of {cell.variant}"])
    results, references = compare.collect(grid, None)
    assert references == ["references of a"]  # the baseline's
    row = build_section(grid, dataset=None, results=results, references=references).rows[1]
    assert row.tests == () and row.delta is None and "'b' seed 1 was scored on other sentences" in row.problem


def test_the_direction_needs_a_paper_delta_with_a_sign(tmp_path):
    grid = _hand_grid(tmp_path)
    section = build_section(grid, dataset=None, results={}, references=None)
    row = replace(section.rows[1], delta=0.8, paper={"All": 92.4})  # the paper's Δ is exactly 0
    assert section.paper_delta(row) == 0.0 and section.direction(row) == "paper ≈ 0"


def test_bleu_significance_on_hand_written_outputs():
    refs = [f"the {w} dog sees a small red ball in the garden ." for w in ("big", "old", "young", "black") * 10]
    good, bad = list(refs), ["a cat ." for _ in refs]
    from sanlab.experiments.grid import EvalSpec

    spec = EvalSpec(bootstrap_samples=100)
    assert paired_test("translation", bad, good, references=refs, spec=spec).mark == "⇑"
    assert paired_test("translation", good, bad, references=refs, spec=spec).mark == "⇓"


# ----------------------------------------------------------------------------- bad grids
def test_unknown_variant_key_names_the_grid_and_the_variant(tmp_path):
    _write(tmp_path / "tagger.yaml", TAGGER)
    bad = _write(tmp_path / "bad.yaml", "base: tagger.yaml\nseeds: [1]\nvariants:\n  - {name: a}\n"
                                        "  - {name: b, overides: [model.dropout=0.2]}\n")
    with pytest.raises(ConfigError) as err:
        load_grid(bad)
    assert str(bad) in str(err.value) and "variant 'b' (variants[1]).overides: unknown key" in str(err.value)


def test_unknown_config_key_in_overrides_names_the_grid_variant_and_key(tmp_path):
    _write(tmp_path / "tagger.yaml", TAGGER)
    bad = _write(tmp_path / "bad.yaml", "base: tagger.yaml\nseeds: [1]\nvariants:\n  - {name: a}\n"
                                        "  - {name: b, overrides: ['model.encoder.atention.heads=2']}\n")
    with pytest.raises(ConfigError) as err:
        load_grid(bad)
    message = str(err.value)
    assert str(bad) in message and "variant 'b'" in message and "model.encoder.atention: unknown key" in message
    assert "model.encoder.atention: unknown key (from the overrides of variant 'b')" in message


def test_a_variant_that_cannot_be_built_fails_when_the_grid_loads(tmp_path):
    """Not hours later, when its cell's turn to train comes: the message names the grid file and variant."""
    _write(tmp_path / "tagger.yaml", TAGGER)
    bad = _write(tmp_path / "bad.yaml", "base: tagger.yaml\nseeds: [1]\nvariants:\n  - {name: a}\n  - name: b\n"
                                        "    overrides: ['model.encoder.attention.parts=[{type: csan2d, heads_area: 5}]',"
                                        " model.encoder.attention.heads=4]\n")
    with pytest.raises(ConfigError) as err:
        load_grid(bad)
    assert str(err.value).startswith(f"{bad}: variant 'b' (base tagger.yaml): this model cannot be built:")


@pytest.mark.parametrize("where, expected", [
    ("recipe", "model.word_dimm: unknown key (set in {base}, line 3)"),
    ("set", "model.word_dimm: unknown key (from the grid's set:)"),
    ("cli", "model.word_dimm: unknown key (from --set)")])
def test_an_invalid_key_of_a_cell_is_traced_to_where_it_was_set(tmp_path, where, expected):
    """Down the recipe's base chain to its file and line, or to the grid's layer that set it."""
    _write(tmp_path / "tagger.yaml", TAGGER)
    base = _write(tmp_path / "mid.yaml", "base: tagger.yaml\ntrain: {batch_size: 4}\n"
                                         + ("model: {word_dimm: 3}\n" if where == "recipe" else ""))
    grid = _write(tmp_path / "g.yaml", "base: mid.yaml\nseeds: [1]\nvariants:\n  - {name: a}\n"
                                       + ("set: [model.word_dimm=3]\n" if where == "set" else ""))
    with pytest.raises(ConfigError) as err:
        load_grid(grid, overrides=["model.word_dimm=3"] if where == "cli" else [])
    assert expected.format(base=base) in str(err.value)


def test_synthetic_data_replaces_the_recipes_test_sets(tmp_path):
    """The Multi30k recipe's test_2016_flickr must not survive as the default eval split of a synthetic grid."""
    grid = load_grid(_write(tmp_path / "g.yaml", f"""\
base: {ROOT / "configs" / "multi30k-en-de-transformer.yaml"}
synthetic: {{task: translation, sizes: {{train: 10, valid: 5, test: 5}}}}
seeds: [1]
variants:
  - {{name: a}}
"""), runs_dir=tmp_path / "runs")
    (cell,) = grid.cells
    assert list(cell.config.data.test) == ["test"] and cell.split == "test"
    assert cell.config.data.test["test"].src == str(tmp_path / "runs" / "data" / "test.src")


def test_other_grid_mistakes_are_named(tmp_path):
    _write(tmp_path / "tagger.yaml", TAGGER)
    head = "base: tagger.yaml\nseeds: [1]\n"
    cases = {"variants:\n  - {name: a}\neval: {split: test}\n": "eval split 'test' is not in this run's data",
             "variants:\n  - {name: a, baseline: true}\n  - {name: b, baseline: true}\n": "more than one variant",
             "variants:\n  - {name: A-1}\n  - {name: a 1}\n": "collide",
             "variants:\n  - {name: a}\neval: {checkpoint: averaged}\n": "average_last",
             "set: {train.keep_last: 2}\nvariants:\n  - {name: a}\neval: {checkpoint: averaged, average_last: 3}\n":
                 r"variant 'a': eval.average_last 3 > train.keep_last 2; the run would not keep"}
    for body, expected in cases.items():
        with pytest.raises(ConfigError, match=expected):
            load_grid(_write(tmp_path / "g.yaml", head + body))
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match="afile: is a file, not a directory for the grid's cells"):
        load_grid(_write(tmp_path / "g.yaml", head + "variants:\n  - {name: a}\n"), runs_dir=tmp_path / "afile")
    grid = load_grid(_write(tmp_path / "g.yaml", head + "variants:\n  - {name: a}\n"))
    with pytest.raises(ConfigError, match="no variant 'zzz'; the grid has: a"):
        select_cells(grid, only=["zzz"])


def test_seed_filter_picks_the_seed_of_every_chosen_variant_that_has_it(tmp_path):
    _write(tmp_path / "tagger.yaml", TAGGER)
    grid = load_grid(_write(tmp_path / "g.yaml", "base: tagger.yaml\nseeds: [1]\nvariants:\n"
                            "  - {name: base, baseline: true, seeds: [1, 2, 3]}\n  - {name: b}\n"
                            "  - {name: c, seeds: [1, 2]}\n"))
    label = lambda cells: [(c.variant, c.seed) for c in cells]  # noqa: E731
    assert label(select_cells(grid, seeds=[2])) == [("base", 2), ("c", 2)]
    assert label(select_cells(grid, only=["base"], seeds=[3, 2])) == [("base", 3), ("base", 2)]  # as given
    assert len(select_cells(grid)) == 6
    with pytest.raises(ConfigError, match="no cell with seed 3 among the chosen variants; their seeds: 1, 2"):
        select_cells(grid, only=["b", "c"], seeds=[1, 3])


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
    other = _write(tmp_path / "other.yaml", text.replace("synthetic: {task: tagging, seed: 1,",
                                                         "synthetic: {task: tagging, seed: 2,"))
    for mode in ({"dry_run": True}, {"table_only": True}):
        with pytest.raises(ConfigError, match="holds a synthetic corpus made with .*'seed': 1.*the grid now asks"):
            run_compare(str(other), overrides=TINY, runs_dir=str(finished.runs_dir), command="t",
                        out=lambda m: None, **mode)
    with pytest.raises(ConfigError, match="--dry-run and --table-only: choose one"):
        run_compare(str(SMOKE), dry_run=True, table_only=True)
    for selection in ({"only": ["vanilla"]}, {"datasets": ["ewt"]}, {"seeds": [1]}):
        with pytest.raises(ConfigError, match="--table-only prints the whole table; --only, --dataset and --seed"):
            run_compare(str(SMOKE), table_only=True, **selection)


def test_second_invocation_reuses_finished_cells(finished, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("a finished cell was trained again")

    monkeypatch.setattr(cells_module, "train_run", no_training)
    monkeypatch.setattr(cells_module, "evaluate_tagging_cell", no_training)
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
    bad = _write(tmp_path / "done.json", '{"summary": ')
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

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

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


def _run_translation_grid(tmp_path) -> str:
    """A 2-variant x 1-seed translation grid on a synthetic corpus, run to the end; returns table.md."""
    recipe = _write(tmp_path / "mt.yaml", """\
task: translation
data: {train: {src: x, tgt: x}, valid: {src: x, tgt: x}, subword: {vocab_size: 120}}
model: {dim: 16, encoder: {layers: 1, ffn_dim: 32, attention: {heads: 2}},
        decoder: {layers: 1, ffn_dim: 32, attention: {heads: 2}}}
train: {max_tokens: 400, warmup_steps: 4, max_steps: 4, valid_every: 2, valid_max_sentences: 5, progress: false,
        keep_best: 1, keep_last: 2}
decode: {beam: 2, max_len_a: 1.0, max_len_b: 2}
""")
    grid_file = _write(tmp_path / "grid.yaml", f"""\
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


# ----------------------------------------------------------------------------- the shipped grids
RECIPES = {"csan-table1-multi30k": {"vanilla": "multi30k-en-de-transformer", "1D-CSAN": "multi30k-en-de-csan1d",
                                    "2D-CSAN": "multi30k-en-de-csan2d", "Rel_Pos": "multi30k-en-de-relpos",
                                    "Bi_Direct": "multi30k-en-de-bidirect", "Neighbor": "multi30k-en-de-neighbor",
                                    "Local_Hard": "multi30k-en-de-localhard", "Local_Soft": "multi30k-en-de-localsoft",
                                    "Block": "multi30k-en-de-block", "CNNs": "multi30k-en-de-cnns",
                                    "MUSE": "multi30k-en-de-muse", "MUSE_FF": "multi30k-en-de-muse-ff",
                                    "DynamicConv": "multi30k-en-de-dynamicconv", "LightConv": "multi30k-en-de-lightconv",
                                    "capsule": "multi30k-en-de-capsule"},
           "dufter-table2-ud": {"SAN+PE[add]": "ud-ewt-tagger", "SAN+P+R": "ud-ewt-pr", "+Temp": "ud-ewt-temp",
                                "+Conv": "ud-ewt-conv", "+Conv2d": "ud-ewt-conv2d", "1D-CSAN": "ud-ewt-csan1d",
                                "2D-CSAN": "ud-ewt-csan2d", "capsule": "ud-ewt-capsule", "MUSE": "ud-ewt-muse",
                                "SAN (no position)": "ud-ewt-san", "MUSE_FF (no convolution)": "ud-ewt-muse-ff",
                                "SAN+PE[con]": "ud-ewt-pe-con", "SAN+PE[add], Keras init": "ud-ewt-tagger"}}
# The documented differences between a row and its recipe.
RECIPE_DIFFERENCES = {"SAN+PE[add], Keras init": ["model.dense_init"]}  # the diagnostic of the reference's init


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_grid_variants_are_their_recipes(name):
    """Each row is its configs/ recipe, but for the documented differences."""
    from sanlab.config import load_config
    from sanlab.experiments.grid import config_dict
    from sanlab.runs import config_differences

    grid = load_grid(ROOT / "configs" / "compare" / f"{name}.yaml")
    for cell in grid.cells:
        recipe = load_config(ROOT / "configs" / f"{RECIPES[name][cell.variant]}.yaml", [f"train.seed={cell.seed}"])
        diff = config_differences(config_dict(recipe), config_dict(cell.config))
        assert diff == RECIPE_DIFFERENCES.get(cell.variant, []), cell.label
    if name == "csan-table1-multi30k":  # every locality row where CSAN is: encoder layers 0-1, layer 2 global
        assert [v.name for v in grid.spec.variants][:10] == ["vanilla", "Bi_Direct", "Rel_Pos", "Neighbor", "Local_Hard",
                                                             "Local_Soft", "Block", "CNNs", "1D-CSAN", "2D-CSAN"]
        for variant in ("Bi_Direct", "Neighbor", "Local_Hard", "Local_Soft", "Block", "CNNs", "1D-CSAN", "2D-CSAN"):
            encoder = next(c for c in grid.cells if c.variant == variant).config.model.encoder
            placed = [p.layers for p in (*encoder.attention.parts, *encoder.pre_blocks)]
            placed += [encoder.mixer.layers] if encoder.mixer.type != "attention" else []
            assert placed == [[0, 1]], variant
        assert grid.seeds_of("vanilla") == grid.seeds_of("2D-CSAN") == [1, 2, 3]
        assert grid.seeds_of("Local_Soft") == [1]  # the grid's default: below vanilla's spread, one seed


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "compare").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_grid_resolves_every_cell(path):
    grid = load_grid(path)
    assert grid.cells and len({c.run_dir for c in grid.cells}) == len(grid.cells)


def test_window_sweep_rows_are_the_csan1d_recipe_with_their_window():
    from sanlab.config import load_config
    from sanlab.experiments.grid import config_dict
    from sanlab.runs import config_differences

    grid = load_grid(ROOT / "configs" / "compare" / "csan-window-sweep-ud.yaml")
    recipe = load_config(ROOT / "configs" / "ud-ewt-csan1d.yaml", ["train.seed=0"])
    sizes = {}
    for cell in grid.cells:
        assert config_differences(config_dict(recipe), config_dict(cell.config)) in ([], ["model.encoder.attention.parts"])
        (part,) = cell.config.model.encoder.attention.parts
        assert part.layers == [0, 1]
        sizes[cell.variant] = part.window_size
    assert sizes == {f"M = {m}": m for m in (11, 3, 5, 7, 15, 25)}


def test_treebank_grid_has_one_table_per_treebank():
    grid = load_grid(ROOT / "configs" / "compare" / "dufter-treebanks-ud.yaml")
    assert grid.datasets == ["English-LinES", "Afrikaans-AfriBooms", "Vietnamese-VTB"] and len(grid.cells) == 45
    assert grid.seeds_of("+Temp") == [0, 1, 42]  # three seeds, as the EWT grid and the paper
    vtb = next(c for c in grid.cells if c.dataset == "Vietnamese-VTB")
    assert vtb.config.data.train.endswith("UD_Vietnamese-VTB/vi_vtb-ud-train.conllu.gz")
    assert vtb.run_dir.parts[-3:] == ("vietnamese-vtb", "san-pe-add", "seed-0")
    assert grid.paper(dataset="Vietnamese-VTB", variant="+Conv2d") == {"All": 86.52}


def test_cells_run_breadth_first_over_seeds(tmp_path):
    """Every row gets its first seed before any row gets its second (partial tables fill every row)."""
    grid = load_grid(ROOT / "configs" / "compare" / "csan-table1-multi30k.yaml", runs_dir=tmp_path)
    order = [(c.variant, c.seed) for c in run_order(grid, grid.cells)]
    rows = [v.name for v in grid.spec.variants]
    assert order[:len(rows)] == [(name, 1) for name in rows]
    later = order[len(rows):]
    assert ("vanilla", 2) in later and ("vanilla", 3) in later  # the grid has rows with more seeds
    # every second seed before any third, each seed's rows in the grid's order
    assert later == sorted(later, key=lambda cell: (cell[1], rows.index(cell[0])))


def test_reproduce_grid_differs_from_the_clean_one_only_by_the_profile_switches():
    from sanlab.experiments.grid import config_dict
    from sanlab.runs import config_differences

    clean = load_grid(ROOT / "configs" / "compare" / "dufter-treebanks-ud.yaml")
    reproduce = load_grid(ROOT / "configs" / "compare" / "dufter-treebanks-ud-reproduce.yaml")
    assert [(c.dataset, c.variant) for c in clean.cells] == [(c.dataset, c.variant) for c in reproduce.cells]
    for a, b in zip(clean.cells, reproduce.cells):
        expected = ["data.vocab_from_all_splits", "model.dense_init", "model.mask_padding", "model.train_pad_rows"]
        if a.variant == "SAN+P+R":
            expected = sorted(expected + ["model.encoder.attention.parts"])
            assert b.config.model.encoder.attention.parts[1].rel_param == "circulant_real"
        assert config_differences(config_dict(a.config), config_dict(b.config)) == expected, a.label
    assert reproduce.paper(dataset="Vietnamese-VTB", variant="+Conv2d") == {"All": 86.52}


@pytest.mark.slow  # two processes that import torch: ~9 s
def test_grid_workers_die_with_the_grid_process(tmp_path):
    """Killing `sanlab compare` (kill, the OOM killer) must not leave workers training locked cells."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text("""\
import os, sys, time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from sanlab.experiments.cells import init_worker

if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=init_worker,
                             initargs=(1, 1, os.getpid())) as pool:
        print(pool.submit(os.getpid).result(), flush=True)
        pool.submit(time.sleep, 120)
        time.sleep(120)
""")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(worker, signal.SIGKILL)
    pytest.fail(f"worker {worker} outlived the killed grid process")


def test_a_row_trained_on_two_machines_averages_the_speeds_of_one(tmp_path):
    """A mean over a CPU cell (0.3 steps/s) and GPU cells (17 steps/s) describes neither: the row takes the
    cells trained as the baseline was, else the largest group, and the legend names the seeds left out."""
    grid = _hand_grid(tmp_path)
    cpu, gpu = "1 job x 2 threads", "6 jobs x 2 threads, cuda (NVIDIA H200)"

    def cell(variant, seed, steps, conditions):
        return CellResult(variant, seed, params=1000, speed={"steps_per_s": steps, "tokens_per_s": 10 * steps},
                          conditions=conditions)

    results = {("base", 1): cell("base", 1, 0.5, cpu), ("base", 2): cell("base", 2, 0.5, cpu),
               ("better", 1): cell("better", 1, 0.4, cpu), ("better", 2): cell("better", 2, 17.0, gpu),
               ("same", 1): cell("same", 1, 0.3, "mixed (2 jobs x 1 thread; 1 job x 1 thread)"),
               ("same", 2): cell("same", 2, 16.0, gpu), ("same", 3): cell("same", 3, 18.0, gpu)}
    section = build_section(grid, dataset=None, results=results, references=None)
    base, better, same = section.rows
    assert base.speed_seeds == (1, 2) and base.speed_left_out == ()
    # the baseline's conditions win: a Δ against it
    assert better.speed_seeds == (1,) and better.steps_per_s.mean == 0.4 and better.speed_comparable
    assert better.steps_delta == pytest.approx(-0.1) and better.speed_left_out == (f"seed 2: {gpu}",)
    # none trained as the baseline: the largest group, shown without a Δ
    assert same.speed_seeds == (2, 3) and same.steps_per_s.mean == 17.0 and not same.speed_comparable
    assert same.speed_conditions == (gpu,) and same.steps_delta is None
    report = Report(title="t", header={}, sections=(section,))
    rows = list(csv.DictReader(io.StringIO(render_csv(report))))
    assert [(r["speed_seeds"], r["speed_conditions"]) for r in rows] == [("1 2", cpu), ("1", cpu), ("2 3", gpu)]
    from sanlab.experiments.compare_report import _speed_subset_legend
    legend = _speed_subset_legend([section])
    assert "better: seed 1 (left out: seed 2: 6 jobs x 2 threads, cuda (NVIDIA H200))" in legend
    assert "same: seeds 2, 3 (left out: seed 1: mixed (2 jobs x 1 thread; 1 job x 1 thread))" in legend


def test_cells_with_another_subword_vocabulary_are_marked(tmp_path):
    """Cells trained by another SentencePiece version (which trains another model from the same texts and seed)
    are marked § and named in the legend; a recorded digest decides where both cells have one."""
    from sanlab.experiments.cells import Vocabulary
    from sanlab.experiments.compare_report import _vocabulary_legend
    grid = _hand_grid(tmp_path)

    def cell(variant, seed, vocabulary):
        return CellResult(variant, seed, params=1000, vocabulary=vocabulary)

    ours, recorded = Vocabulary("0.2.3"), Vocabulary("0.2.3", "89d153039078f756")
    results = {("base", 1): cell("base", 1, ours), ("base", 2): cell("base", 2, recorded),
               ("better", 1): cell("better", 1, recorded), ("better", 2): cell("better", 2, Vocabulary("0.2.2")),
               ("same", 1): cell("same", 1, Vocabulary("0.2.3", "0123456789abcdef")), ("same", 2): cell("same", 2, None)}
    section = build_section(grid, dataset=None, results=results, references=None)
    base, better, same = section.rows
    assert base.vocabulary_differs == ()
    assert better.vocabulary_differs == ("seed 2: sentencepiece 0.2.2 (baseline: sentencepiece 0.2.3)",)
    assert same.vocabulary_differs == ()  # the baseline's seed 1 recorded no digest: the versions agree
    assert Vocabulary("0.2.3", "0123456789abcdef").differs(recorded)
    names = [line.split(" | ")[0] for line in section_markdown(section) if line.startswith("| ")]
    assert names == ["| variant", "| base (baseline)", "| better (§)", "| same"]
    assert "better: seed 2: sentencepiece 0.2.2" in _vocabulary_legend([section])[0]


def test_a_cell_records_its_vocabulary(tmp_path):
    from sanlab.data.subword import train_joint
    from sanlab.experiments.cells import cell_vocabulary, vocabulary_digest
    assert vocabulary_digest(tmp_path) is None
    model = train_joint(["ein Haus", "a house"] * 50, ["ein Haus"] * 100, model_path=tmp_path / "subword",
                        vocab_size=30)
    assert vocabulary_digest(tmp_path) == model.digest()
    (tmp_path / "meta.json").write_text(json.dumps({"versions": {"sentencepiece": "0.2.3"}}))
    done = {"config": {"data": {"subword": {"vocab_size": 30}}}, "vocabulary": model.digest()}
    assert str(cell_vocabulary(tmp_path, done)) == f"sentencepiece 0.2.3, vocabulary {model.digest()}"
    assert cell_vocabulary(tmp_path, {"config": {"data": {}}}) is None  # tagging: no subword model


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
    assert [i.error for i in import_cells(grid, archive2, log=lambda m: None)] == [None]
    assert status(other) == "evaluated"
    # the command: the table follows, and a cell left out makes it exit 1, saying why
    printed = []
    assert run_compare(str(SMOKE), overrides=TINY, runs_dir=str(runs), imports=[str(archive2)],
                       command="sanlab compare smoke --import", out=printed.append) == 1
    assert "- cells done: 4 of 4" in printed[0]
    assert printed[-1].startswith(f"NOT IMPORTED {other.label} from {archive2}: ") and "exists here" in printed[-1]
    with pytest.raises(ConfigError, match="--import adds cells and prints the table"):
        run_compare(str(SMOKE), overrides=TINY, runs_dir=str(runs), imports=[str(archive2)], table_only=True)


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
        f"about {expected} of updates left for 4 cells, one at a time, at the speed of the 4 cells trained on this "
        "machine (by variant where there are some); validation and evaluation come on top")
    listing = describe_cells(longer, longer.cells).splitlines()
    assert listing[-1] == time_left(longer, longer.cells)
    for cell, line in zip(longer.cells, listing):  # each cell's own share, at its variant's speed
        minutes = round(399_996 / (sum(speeds[cell.variant]) / 2) / 60)
        own = f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
        assert line.startswith(cell.label) and line.endswith(f"  ~{own} of updates"), line
    assert not any("of updates" in line for line in describe_cells(finished, finished.cells).splitlines())
