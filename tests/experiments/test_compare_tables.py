"""``sanlab compare``'s aggregation and table: mean ± sd and majority significance marks by hand, the rendered
markdown and CSV rows, speed conditions and when a speed delta is withheld (a row trained on two machines),
cells marked for another subword vocabulary, and which cells are paired for a test. Hand-written cells only:
nothing trains here (the end-to-end runs are in test_compare.py).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import replace

import pytest

from sanlab.evaluation.significance import paired_bootstrap_accuracy
from sanlab.experiments import cells as cells_module
from sanlab.experiments.cells import CellResult, speed_conditions
from sanlab.experiments.compare import build_report, build_section, majority_mark, paired_test
from sanlab.experiments.grid import load_grid
from sanlab.experiments.tables import (Report, SeedsTest, Stat, format_stat, render_csv, render_markdown,
                                      section_markdown)

from compare_fixtures import TAGGER, write


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
    write(tmp_path / "tagger.yaml", TAGGER)
    return load_grid(write(tmp_path / "g.yaml", """\
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
    # Δ over every seed done may have the other sign than the paired tests' majority: the mark gives the way
    assert direction(replace(shown, delta=-0.07, mark="↑")) == "same"
    assert direction(replace(shown, delta=+0.07, mark="↓")) == "opposite"
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
    # deterministic algorithms (slower on a GPU) are named; a session recorded before they were ran without them,
    # also in a run resumed with them since
    assert conditions([{**gpu, "deterministic": True}]) == \
        "1 job x 1 thread, cuda (NVIDIA H100 80GB HBM3), bf16, compiled, deterministic"
    assert conditions([old, {**cpu, "deterministic": True}], {"train": {"deterministic": True}}) == \
        "mixed (1 job x 1 thread; 1 job x 1 thread, deterministic)"
    assert conditions([{**cpu, "deterministic": False}]) == "1 job x 1 thread"
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

    write(tmp_path / "mt.yaml", "task: translation\ndata: {train: {src: x, tgt: x}, valid: {src: x, tgt: x}, "
                                 "test: {t: {src: a.src, tgt: a.tgt}}}\n")
    grid = load_grid(write(tmp_path / "g.yaml", "base: mt.yaml\nseeds: [1]\nvariants:\n  - {name: a}\n"
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


def test_speeds_from_another_machine_get_no_delta(tmp_path):
    """The same jobs x threads on another CPU (or core count, or torch) time another machine, not the variant."""
    grid = _hand_grid(tmp_path)
    here, there = "Linux x86_64, 2 cores, torch 2.13.0+cpu, python 3.11.7", "Linux x86_64, 16 cores, torch 2.11.0, python 3.12.3"

    def cell(variant, seed, steps, machine):
        return CellResult(variant, seed, params=1000, speed={"steps_per_s": steps, "tokens_per_s": 10 * steps},
                          conditions="1 job x 2 threads", machine=machine)

    results = {("base", 1): cell("base", 1, 2.0, here), ("better", 1): cell("better", 1, 4.0, there),
               ("same", 1): cell("same", 1, 1.5, here), ("same", 2): cell("same", 2, 9.0, there)}
    section = build_section(grid, dataset=None, results=results, references=None)
    base, better, same = section.rows
    assert not better.speed_comparable and better.steps_delta is None
    # a row with cells on both machines times those on the baseline's and names the other
    assert same.speed_seeds == (1,) and same.steps_delta == pytest.approx(-0.5)
    assert same.speed_left_out == (f"seed 2: 1 job x 2 threads on {there}",)
    from sanlab.experiments.compare_report import _speed_legend

    legend = _speed_legend([section])
    assert legend.startswith(" (†): trained with other jobs x threads than the baseline, or on another machine, or")
    assert f"better: 1 job x 2 threads on {there} (baseline: 1 job x 2 threads on {here})" in legend


def test_a_cell_that_does_not_record_its_machine_counts_as_its_conditions_machine(tmp_path):
    grid = _hand_grid(tmp_path)
    here = "Linux x86_64, 2 cores, torch 2.13.0+cpu, python 3.11.7"
    results = {("base", s): CellResult("base", s, params=1000, speed={"steps_per_s": 2.0 * s, "tokens_per_s": 20.0},
                                       conditions="1 job x 2 threads", machine=None if s == 1 else here)
               for s in (1, 2, 3)}
    results[("same", 1)] = CellResult("same", 1, params=1000, speed={"steps_per_s": 1.0, "tokens_per_s": 10.0},
                                      conditions="1 job x 2 threads", machine=here)
    base, _, same = build_section(grid, dataset=None, results=results, references=None).rows
    assert base.speed_seeds == (1, 2, 3) and base.steps_per_s.mean == pytest.approx(4.0)
    assert same.speed_comparable and same.steps_delta == pytest.approx(-3.0)


def test_a_left_out_cell_that_does_not_record_its_machine_says_so(tmp_path):
    # (an older cell under conditions no other cell shares: its machine cannot be told, and is not "None")
    grid = _hand_grid(tmp_path)
    here = "Linux x86_64, 2 cores, torch 2.13.0+cpu, python 3.11.7"
    results = {("base", s): CellResult("base", s, params=1000, speed={"steps_per_s": 2.0, "tokens_per_s": 20.0},
                                       conditions="2 jobs x 1 thread", machine=here) for s in (1, 2)}
    results[("base", 3)] = CellResult("base", 3, params=1000, speed={"steps_per_s": 3.0, "tokens_per_s": 30.0},
                                      conditions="1 job x 1 thread", machine=None)
    base = build_section(grid, dataset=None, results=results, references=None).rows[0]
    assert base.speed_seeds == (1, 2)
    assert base.speed_left_out == ("seed 3: 1 job x 1 thread (machine not recorded)",)


def test_the_tables_never_replace_a_users_files_in_runs_dir(tmp_path):
    """`runs_dir: .` in a project with its own table.csv: compare wrote its table over it. Tables sanlab wrote
    (beside their table.json) are replaced as before."""
    from sanlab.errors import ConfigError
    from sanlab.experiments.tables import write_report

    report = Report(title="t", header={"grid": "g"}, sections=())
    (tmp_path / "table.csv").write_text("the user's,table\n")
    with pytest.raises(ConfigError, match=r"table.csv: not a table sanlab wrote \(no table.json of its report\)"):
        write_report(report, tmp_path)
    assert (tmp_path / "table.csv").read_text() == "the user's,table\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.csv"]
    (tmp_path / "table.csv").unlink()
    write_report(report, tmp_path)
    assert json.loads((tmp_path / "table.json").read_text())["title"] == "t"
    write_report(replace(report, title="again"), tmp_path)  # its own tables: replaced
    assert json.loads((tmp_path / "table.json").read_text())["title"] == "again"


@pytest.mark.parametrize("p, shown", [(0.004, "p = 0.004"), (0.0496, "p = 0.0496"), (0.0099, "p = 0.0099"),
                                      (0.14, "p = 0.14"), (1.0, "p = 1.00")])
def test_an_unmarked_seeds_test_p_is_never_rounded_to_zero_or_onto_a_threshold(tmp_path, p, shown):
    # two seeds a side give the seeds test's p but no mark: 0.004 printed as "p = 0.00" claimed an impossible p
    # (a bootstrap's smallest is 1/(B+1)), and 0.0496 as "p = 0.05" hid that it is below 0.05
    grid = _hand_grid(tmp_path)
    flags = [[True, False]] * 10
    results = {(v, s): CellResult(v, s, scores={"all": 50.0}, evidence=flags) for v in ("base", "better") for s in (1, 2)}
    section = build_section(grid, dataset=None, results=results, references=None)
    better = section.rows[1]
    assert better.seeds_test is not None and better.seeds_test.mark == ""
    row = replace(better, seeds_test=replace(better.seeds_test, p_value=p))
    line = next(line for line in section_markdown(replace(section, rows=(section.rows[0], row)))
                if line.startswith("| better |"))
    assert f"| {shown} |" in line


def test_the_direction_of_a_row_without_any_test_is_not_called_not_significant(tmp_path):
    # the variant's only seed is not one the baseline has: no paired test ran, and no seeds test (one seed a
    # side), so nothing was found not significant; the table said "n.s."
    grid = _hand_grid(tmp_path)
    flags = [[True, False]] * 10
    results = {("base", 1): CellResult("base", 1, scores={"all": 50.0}, evidence=flags),
               ("better", 2): CellResult("better", 2, scores={"all": 60.0}, evidence=flags)}
    section = build_section(grid, dataset=None, results=results, references=None)
    better = replace(section.rows[1], paper={"All": 93.0})
    section = replace(section, rows=(section.rows[0], better))
    assert better.tests == () and better.seeds_test is None and better.delta == pytest.approx(10.0)
    assert section.direction(better) == "untested"
    assert "| 60.00 | +10.00 |  | — | — | 93.00 | +0.60 | untested |" in "\n".join(section_markdown(section))
    # three seeds a side with none shared: the seeds test ran and decides
    seeds = SeedsTest(seeds=(4, 5, 6), baseline_seeds=(1, 2, 3), delta=10.0, p_value=0.01, mark="↑")
    assert section.direction(replace(better, seeds_test=seeds)) == "same"
    assert section.direction(replace(better, seeds_test=replace(seeds, mark=""))) == "n.s."


def test_the_csv_p_values_are_not_rounded_onto_a_threshold(tmp_path):
    # with 10,000 resamples p = 500/10001 = 0.049995 is below 0.05 (the row is marked ↑), but 4 significant
    # digits wrote it as 0.05, and the CSV is where the table sends a reader for every p-value
    grid = _hand_grid(tmp_path)
    flags = [[True, False]] * 10
    results = {(v, 1): CellResult(v, 1, scores={"all": 50.0}, evidence=flags) for v in ("base", "better")}
    section = build_section(grid, dataset=None, results=results, references=None)
    base, better = section.rows[:2]
    test = replace(better.tests[0], p_value=500 / 10001, delta=1.0, mark="↑")
    row = replace(better, tests=(test,), mark="↑", mark_support=1)
    lines = list(csv.DictReader(io.StringIO(render_csv(Report(title="t", header={}, sections=(
        replace(section, rows=(base, row)),))))))
    p = lines[1]["p_values"].removeprefix("seed 1: ")
    assert float(p) < 0.05 and float(p) == pytest.approx(500 / 10001)
