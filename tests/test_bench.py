"""The bench scripts run end to end on small inputs and report against their baseline (the numbers
themselves are measurements, never asserted)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_grid_speed_reports_every_variant_against_the_baseline(tmp_path):
    out = tmp_path / "speed.md"
    subprocess.run([sys.executable, str(ROOT / "bench" / "grid_speed.py"), "configs/compare/smoke-synthetic.yaml",
                    "--threads", "1", "--updates", "1", "--rounds", "2", "--warmup", "0", "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    rows = [line.strip("| ").split(" | ") for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["SAN+PE[add] (baseline)", "1D-CSAN"]
    assert rows[0][4] == "1.00" and len(rows[1][5].split()) == 2  # the ratio to itself; one rate per round


@pytest.mark.slow
def test_char_cnn_bench_times_both_paths_on_a_synthetic_tagger(tmp_path):
    from sanlab.data.synthetic import write_tagging_corpus

    write_tagging_corpus(tmp_path, seed=1, sizes={"train": 64, "dev": 8, "test": 8})
    out = tmp_path / "char.md"
    data = [f"--set=data.{s}={tmp_path / f'{s}.conllu'}" for s in ("train", "dev", "test")]
    subprocess.run([sys.executable, str(ROOT / "bench" / "char_cnn.py"), "configs/ud-ewt-tagger.yaml", *data,
                    "--set=model.encoder.layers=1", "--threads", "1", "--updates", "1", "--rounds", "2",
                    "--out", str(out)], cwd=ROOT, check=True, capture_output=True)
    rows = [line.strip("| ").split(" | ") for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["every word slot (reference)", "distinct words of the batch"]
    assert rows[0][2] == "1.00" and float(rows[1][1]) > 0


def _tiny_translation_grid(tmp_path, *, vocab: int, variant: str, synthetic: str = "") -> None:
    """tmp_path/grid.yaml: vanilla and ``variant`` (a YAML flow mapping) over a d = 16, 1+1-layer recipe."""
    (tmp_path / "mt.yaml").write_text(f"""\
task: translation
data: {{train: {{src: x, tgt: x}}, valid: {{src: x, tgt: x}}, subword: {{vocab_size: {vocab}}}}}
model: {{dim: 16, encoder: {{layers: 1, ffn_dim: 32, attention: {{heads: 2}}}},
        decoder: {{layers: 1, ffn_dim: 32, attention: {{heads: 2}}}}}}
""")
    (tmp_path / "grid.yaml").write_text(f"base: mt.yaml\n{synthetic}seeds: [1]\nvariants:\n  - {{name: vanilla}}\n"
                                        f"  - {variant}\n")


@pytest.mark.slow
def test_decode_speed_times_every_variant_and_the_reference_paths(tmp_path):
    _tiny_translation_grid(tmp_path, vocab=120,
                           variant='{name: capsule, overrides: ["model.decoder.attention.parts=[{type: capsule}]"]}',
                           synthetic="synthetic: {task: translation, sizes: {train: 60, valid: 6, test: 2}}\n")
    out = tmp_path / "decode.md"
    subprocess.run([sys.executable, str(ROOT / "bench" / "decode_speed.py"), str(tmp_path / "grid.yaml"),
                    "--recompute", "capsule", "--reorder-whole", "capsule", "--threads", "1", "--sentences", "4",
                    "--batch", "2", "--beam", "2", "--length", "5", "--rounds", "2", "--out", str(out)], cwd=ROOT, check=True, capture_output=True)
    text = out.read_text()
    rows = [line.strip("| ").split(" | ") for line in text.splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["vanilla (baseline)", "capsule", "capsule (prefix recomputed)",
                                    "capsule (whole cache reordered)"]
    assert rows[0][3] == "1.00" and all(len(r[4].split()) == 2 for r in rows)  # one rate per round
    # operators per step: capsule's routing adds some; recomputing the prefix adds arithmetic, hardly any operators
    # (its first steps differ: a few in all); copying the source side too adds its index_selects
    ops = [float(r[5]) for r in rows]
    assert 0 < ops[0] < ops[1] and abs(ops[2] - ops[1]) <= 2 and ops[1] < ops[3]
    assert "4 validation sentences in batches of 2, beam 2, every hypothesis forced to 5 tokens" in text
    # the reference rows decode what the usual path decodes (untrained weights, the same for both)
    assert "capsule (prefix recomputed): the same best hypothesis as capsule in 4 of 4" in text
    assert "capsule (whole cache reordered): the same best hypothesis as capsule in 4 of 4" in text
    assert re.search(r"in 4 of 4 sentences; speed \d+\.\d{3} of capsule's \(median of per-round ratios\)", text)
    too_long = subprocess.run([sys.executable, str(ROOT / "bench" / "decode_speed.py"), str(tmp_path / "grid.yaml"),
                               "--set", "model.max_positions=210", "--length", "211"], cwd=ROOT, capture_output=True,
                              text=True)
    assert too_long.returncode == 2
    assert "--length 211 is beyond model.max_positions of vanilla / seed 1, capsule / seed 1 (210)" in too_long.stderr
    greedy = subprocess.run([sys.executable, str(ROOT / "bench" / "decode_speed.py"), str(tmp_path / "grid.yaml"),
                             "--reorder-whole", "capsule", "--beam", "1"], cwd=ROOT, capture_output=True, text=True)
    assert greedy.returncode == 2 and "--reorder-whole needs --beam 2 or more" in greedy.stderr


@pytest.mark.slow
def test_gpu_bench_reports_flops_and_ratios_on_the_cpu(tmp_path):
    """bench/gpu.py's CPU smoke path: every variant against the baseline, counted FLOPs, a compiled row, a row under
    deterministic algorithms."""
    _tiny_translation_grid(tmp_path, vocab=50,
                           variant='{name: 1D-CSAN, overrides: ["model.encoder.attention.parts=[{type: window, size: 3}]"]}')
    out = tmp_path / "gpu.md"
    subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), str(tmp_path / "grid.yaml"), "--device", "cpu",
                    "--precision", "fp32", "--quick", "--threads", "1", "--compile", "vanilla", "--backend", "eager",
                    "--deterministic", "1D-CSAN",
                    "--out", str(out), "--profile", str(tmp_path / "prof"), "--profile-updates", "2",
                    "--profile-trace"], cwd=ROOT, check=True, capture_output=True)
    rows = [line.strip("| ").split(" | ") for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["vanilla (baseline)", "1D-CSAN", rows[2][0], "1D-CSAN (deterministic)"]
    assert rows[2][0].startswith("vanilla (compiled)")
    assert rows[0][4] == "1.00" and all(float(r[5]) > 0 for r in rows) and rows[0][6] == "n/a"
    # operators of an eager forward and backward (kernel launches on a GPU); a compiled row has none to count
    assert 0 < int(rows[0][7]) < int(rows[1][7]) and rows[2][7] == "—"  # the window's mask adds some
    assert int(rows[3][7]) == int(rows[1][7])  # the same operators: deterministic kernels, not other ones (CPU)
    # the table is rewritten after every round; the last one is whole
    assert "partial" not in out.read_text().splitlines()[0] and "median of 2 rounds" in out.read_text()
    # --profile: each row's share of products (the CPU's own ops here) and its top ops; a trace per row
    profile = (tmp_path / "prof" / "profile.md").read_text()
    assert [line[3:] for line in profile.splitlines() if line.startswith("## ")] == ["vanilla", "1D-CSAN",
                                                                                    "vanilla (compiled)",
                                                                                    "1D-CSAN (deterministic)"]
    shares = [int(m) for m in re.findall(r"products (\d+)% of device time", profile)]
    assert len(shares) == 4 and all(0 < s < 100 for s in shares)
    assert "`aten::" in profile and len(list((tmp_path / "prof").glob("*.trace.json.gz"))) == 4


def test_attention_window_bench_times_every_plan_and_the_global_kernel_it_must_beat():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "attention_window.py"), "--quick", "--threads", "1",
                           "--lengths", "24", "--batch", "2", "--heads", "2", "--head-dim", "8", "--size", "5"],
                          cwd=ROOT, check=True, capture_output=True, text=True)
    # rows of I, method (two words), ms, ratio, ops
    rows = [line.split() for line in done.stdout.splitlines()[2:] if len(line.split()) == 6]
    assert [" ".join(r[1:3]) for r in rows] == ["1D dense", "1D sdpa+mask", "1D banded", "2D dense", "2D banded",
                                                "global sdpa"]
    assert all(float(r[3]) > 0 for r in rows)
    ops = {" ".join(r[1:3]): int(r[5]) for r in rows}
    assert ops["global sdpa"] < ops["1D sdpa+mask"] < ops["1D banded"]  # a fused kernel, then masks, then the spans
    assert "global sdpa / fastest 1D window plan:" in done.stdout
    # what the numbers are of: the command again, the CPU's model, torch and python (it said torch alone)
    assert "- command: `python bench/attention_window.py --quick --threads 1 --lengths 24" in done.stdout
    assert re.search(r"- machine: CPU .+ \(\d+ cores\), .*torch .+, python \d", done.stdout)


@pytest.mark.slow  # two models, one update each, twice over
def test_train_step_bench_says_its_command_and_machine_and_the_ratio_to_nn_transformer():
    done = _bench("train_step.py", "--threads", "1", "--repeats", "1", "--batch", "2", "--length", "6")
    assert done.returncode == 0, done.stderr
    assert "- command: `python bench/train_step.py --threads 1 --repeats 1 --batch 2 --length 6`" in done.stdout
    assert re.search(r"- machine: CPU .+ \(\d+ cores\), .*torch .+, python \d", done.stdout)
    rows = [line.strip("| ").split(" | ") for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["nn.Transformer", "sanlab Seq2Seq"] and rows[0][3] == "1.00"


@pytest.mark.slow
def test_trainer_versions_bench_loads_another_revisions_loop_and_checks_the_weights(tmp_path):
    """Against HEAD (the same loop.py, loaded as a module of its own): same weights, both rates reported."""
    import yaml

    from training_fixtures import make_reverse_config

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(make_reverse_config(tmp_path).model_dump(mode="json")))
    out = tmp_path / "trainer.md"
    subprocess.run([sys.executable, str(ROOT / "bench" / "trainer_versions.py"), str(config), "--against", "HEAD",
                    "--threads", "1", "--updates", "2", "--rounds", "2", "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    text = out.read_text()
    rows = [line.strip("| ").split(" | ") for line in text.splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["at HEAD (reference)", "this checkout"] and rows[0][2] == "1.00"
    assert "Weights bit-identical after each round: yes, yes." in text


@pytest.mark.slow
def test_part_versions_bench_switches_the_parts_class_and_compares_training_and_decoding(tmp_path):
    """Against HEAD (the same rel_pos.py, loaded as a module of its own): the parts switched, the same weights and
    translations, both rates reported; a recipe without the part is refused."""
    import yaml

    from training_fixtures import make_reverse_config

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(make_reverse_config(tmp_path).model_dump(mode="json")))
    out = tmp_path / "part.md"
    bench = [sys.executable, str(ROOT / "bench" / "part_versions.py"), str(config), "--against", "HEAD",
             "--module", "sanlab.attention.parts.rel_pos", "--threads", "1", "--updates", "2", "--rounds", "2"]
    subprocess.run([*bench, "--set", "model.encoder.attention.parts=[{type: rel_pos}]", "--decode", "3",
                    "--out", str(out)], cwd=ROOT, check=True, capture_output=True)
    text = out.read_text()
    rows = [line.strip("| ").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    assert [r[0] for r in rows] == ["version", "at HEAD (reference)", "this checkout"] * 2 and rows[1][2] == "1.00"
    assert re.search(r"; \d+ module\(s\) switched;", text)
    assert "after each round: 0.00e+00, 0.00e+00." in text and "identical best hypotheses: 3 of 3." in text
    without = subprocess.run(bench, cwd=ROOT, capture_output=True, text=True)
    assert without.returncode != 0 and "no module of the model is a class of sanlab.attention.parts.rel_pos" \
        in without.stderr
    # rounds past epoch 0's batches timed no updates and reported a made-up rate
    longer = subprocess.run([*bench, "--updates", "10", "--rounds", "10"], cwd=ROOT, capture_output=True, text=True)
    assert longer.returncode != 0 and re.search(r"--rounds 10 x --updates 10 need 100 batches; epoch 0 of .* has \d+",
                                                longer.stderr), longer.stderr


@pytest.mark.slow
def test_search_versions_bench_decodes_with_both_searches(tmp_path):
    out = tmp_path / "search.md"
    subprocess.run([sys.executable, str(ROOT / "bench" / "search_versions.py"), "--against", "HEAD", "--rounds", "1",
                    "--sentences", "4", "--vocab", "50", "--length", "8", "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    assert "Same output in 4 of 4 sentences." in out.read_text()


@pytest.mark.slow
def test_block_layer_bench_times_every_path_against_the_reference():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "block_layer.py"), "--threads", "1", "--shape",
                             "2", "10", "3", "--rounds", "1", "--repeats", "1"],
                            cwd=ROOT, check=True, capture_output=True, text=True)
    rows = [line.strip("| ").split(" | ") for line in result.stdout.splitlines() if line.startswith("| 2, 10")]
    assert [r[1] for r in rows] == ["reference (per direction)", "fast, one direction after the other (CPU)",
                                    "fast, both directions at once (accelerator)"]
    assert rows[0][3] == "1.00"  # the reference against itself
    assert int(rows[2][4]) < int(rows[0][4])  # both directions at once: fewer operators than per direction
    assert float(rows[1][5]) == float(rows[2][5]) < float(rows[0][5])  # fewer passes over the pair tensors


def _gpu_bench_module(monkeypatch):
    """bench/gpu.py imported in this process (its functions, without a subprocess that imports torch anew)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # (its own imports: grid_speed, op_count)
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_gpu", gpu)  # (its dataclasses look their module up there)
    spec.loader.exec_module(gpu)
    return gpu


def test_a_gpu_bench_row_that_cannot_be_built_is_named_and_the_others_kept(monkeypatch):
    """A compiled or deterministic row that fails (a compiler error, an operator without a deterministic form on
    CUDA) is named under the table; the rows of the other variants are still timed and written."""
    from types import SimpleNamespace

    gpu = _gpu_bench_module(monkeypatch)
    steps = []

    def build(cell):
        if cell.variant == "Rel_Pos":
            raise RuntimeError("scatter_add_cuda_kernel does not have a\ndeterministic implementation")
        return SimpleNamespace(name=cell.variant, step=lambda: steps.append(cell.variant))

    failed = []
    rows = gpu.optional_rows([SimpleNamespace(variant=v) for v in ("vanilla", "Rel_Pos", "Block")], failed, build,
                             "deterministic")
    assert [r.name for r in rows] == ["vanilla", "Block"] and steps == ["vanilla", "Block"]
    assert failed == ["Rel_Pos (deterministic): RuntimeError: scatter_add_cuda_kernel does not have a deterministic "
                      "implementation"]


def test_the_gpu_bench_refuses_a_length_past_a_variants_max_positions(monkeypatch, capsys):
    """--length L builds sentences of L tokens (targets of L + 1, shifted): past a variant's model.max_positions the
    model refuses them (ValueError) after the rows before it had been built and timed. Refused up front, naming the
    limit and the variant."""
    import argparse
    from types import SimpleNamespace

    gpu = _gpu_bench_module(monkeypatch)
    cells = [SimpleNamespace(variant=v, config=SimpleNamespace(model=SimpleNamespace(max_positions=n)))
             for v, n in (("vanilla", 1024), ("CNNs", 128))]
    parser = argparse.ArgumentParser(prog="gpu.py")
    gpu.check_length(parser, cells, 128)  # the longest both take
    with pytest.raises(SystemExit) as stop:
        gpu.check_length(parser, cells, 129)
    assert stop.value.code == 2
    assert ("gpu.py: error: --length 129: longer than variant CNNs's model.max_positions (128)"
            in capsys.readouterr().err)


def _bench(script: str, *args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow  # trains a recipe for 2 updates
def test_variant_smoke_only_runs_the_recipe_named_exactly(tmp_path):
    """--only ud-ewt-p used to run every recipe whose name holds it (ud-ewt-pe-con, ud-ewt-pr as well)."""
    out = tmp_path / "smoke.md"
    out.write_text("Command: `python bench/variant_smoke.py --steps 300`\n\n"  # a report of an earlier run
                   "| ud-ewt-san.yaml | 300 | 2.0 | 1.0 | yes | yes | 9 |\n")  # a row of it: kept
    done = _bench("variant_smoke.py", "--only", "ud-ewt-p", "--steps", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = [line.split("|")[1].strip() for line in out.read_text().splitlines() if ".yaml |" in line]
    assert rows == ["ud-ewt-p.yaml", "ud-ewt-san.yaml"]  # in the recipes' order


@pytest.mark.slow  # the script imports torch before it parses its arguments (~4 s)
def test_variant_smoke_refuses_an_unknown_recipe_naming_the_known_ones(tmp_path):
    done = _bench("variant_smoke.py", "--only", "muse", "--steps", "2", "--out", str(tmp_path / "smoke.md"))
    assert done.returncode == 2 and "no recipe named 'muse'" in done.stderr
    assert "ud-ewt-muse-ff, ud-ewt-muse," in done.stderr and not (tmp_path / "smoke.md").exists()


@pytest.mark.slow  # two tiny taggers trained for 2 updates each
def test_ud_conv2d_check_compares_two_tagging_runs_on_their_test_set(tmp_path):
    from sanlab.config import validate
    from sanlab.data.synthetic import write_tagging_corpus
    from sanlab.runs import train_run

    data = tmp_path / "data"
    write_tagging_corpus(data, seed=2, sizes={"train": 40, "dev": 10, "test": 10})
    runs = []
    for seed in (1, 2):
        config = validate({"task": "tagging", "data": {"train": str(data / "train.conllu"),
                                                       "dev": str(data / "dev.conllu"),
                                                       "test": str(data / "test.conllu")},
                           "model": {"word_dim": 16, "char_dim": 8, "char_filters": 8, "char_layers": 1,
                                     "encoder": {"layers": 1}},
                           "train": {"progress": False, "batch_size": 8, "max_steps": 2, "seed": seed}},
                          source="test")
        runs.append(tmp_path / f"run-{seed}")
        train_run(config, runs[-1], quiet=True)
    done = _bench("ud_conv2d_check.py", *map(str, runs), "--samples", "50", "--seed", "7")
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ")[0].strip("| ") for line in done.stdout.splitlines() if line.startswith("| SAN")]
    assert rows == ["SAN+PE[add]", "SAN+PE[add]+Conv2d"]
    assert "paired bootstrap over test sentences (50 samples, seed 7): delta " in done.stdout


def test_ud_conv2d_check_says_its_usage():
    """It read sys.argv[1] and [2] at import: a missing run was an IndexError traceback."""
    assert "RUN_PE_ADD RUN_CONV2D" in _bench("ud_conv2d_check.py", "--help").stdout
    done = _bench("ud_conv2d_check.py", "runs/only-one")
    assert done.returncode == 2 and "the following arguments are required: RUN_CONV2D" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow  # runs the bench on the CPU
def test_gpu_bench_compares_with_the_declared_baseline_not_the_first_row(tmp_path):
    """A grid's `baseline: true` variant need not be its first: the ratios were to whichever row came first."""
    _tiny_translation_grid(tmp_path, vocab=50, variant="{name: plain, baseline: true}")
    out = tmp_path / "gpu.md"
    done = _bench("gpu.py", str(tmp_path / "grid.yaml"), "--device", "cpu", "--precision", "fp32", "--quick",
                  "--threads", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = [line.strip("| ").split(" | ") for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["vanilla", "plain (baseline)"] and rows[1][4] == "1.00"


@pytest.mark.slow  # the bench imports torch and reads the grid before it refuses (~5 s each)
@pytest.mark.parametrize("option", ["--only", "--compile", "--deterministic"])
def test_gpu_bench_refuses_a_variant_the_grid_has_not(tmp_path, option):
    """An unknown name was left out silently (a typo timed nothing but the baseline, or no compiled row)."""
    _tiny_translation_grid(tmp_path, vocab=50, variant="{name: 1D-CSAN}")
    done = _bench("gpu.py", str(tmp_path / "grid.yaml"), "--device", "cpu", "--quick", option, "1d-csan")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (f"gpu.py: error: {option}: no variant named '1d-csan' in {tmp_path / 'grid.yaml'}; its variants are: "
            "vanilla, 1D-CSAN") in done.stderr


def _data_scale(monkeypatch, multi30k: Path):
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # (its own import: report)
    spec = importlib.util.spec_from_file_location("bench_data_scale", ROOT / "bench" / "data_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "MULTI30K", multi30k)
    return module


def _fake_multi30k(root: Path) -> Path:
    """A few hundred Multi30k-like pairs: train and val, English and German."""
    import gzip
    import random

    rng = random.Random(0)
    words = {"en": "a man dog runs in the park with red ball two women sit on bench near water".split(),
             "de": "ein mann hund läuft im park mit rotem ball zwei frauen sitzen auf bank nahe wasser".split()}
    root.mkdir()
    for split, n in (("train", 300), ("val", 20)):
        lengths = [rng.randint(3, 9) for _ in range(n)]
        for side, vocab in words.items():
            with gzip.open(root / f"{split}.{side}.gz", "wt", encoding="utf-8") as f:
                f.writelines(" ".join(rng.choice(vocab) for _ in range(k)) + "\n" for k in lengths)
    return root


def test_data_scale_regenerates_its_corpus_for_other_pairs(tmp_path, monkeypatch):
    """The corpus under --work was kept whenever train.de existed: another --pairs measured the old corpus under
    the new count. corpus.json (written last) says what the files hold."""
    scale = _data_scale(monkeypatch, _fake_multi30k(tmp_path / "multi30k"))
    work = tmp_path / "work"
    assert scale.generate(work, 50)
    assert len((work / "train.de").read_text().splitlines()) == 50
    assert json.loads((work / "corpus.json").read_text())["pairs"] == 50
    before = (work / "train.en").stat().st_mtime_ns
    assert not scale.generate(work, 50)
    assert (work / "train.en").stat().st_mtime_ns == before  # the same corpus: kept
    scale.generate(work, 30)
    assert len((work / "train.en").read_text().splitlines()) == 30 == len((work / "train.de").read_text().splitlines())
    (work / "corpus.json").unlink()  # a generation killed before its end: made again
    (work / "valid.de").unlink()
    scale.generate(work, 30)
    assert (work / "valid.de").exists() and (work / "corpus.json").exists()


def test_data_scale_never_writes_or_deletes_in_a_work_directory_it_did_not_make(tmp_path, monkeypatch, capsys):
    """--work naming a directory of the user's (their data, with its own cache/ and train.en): the script
    replaced train.en and deleted cache/ whole before measuring anything."""
    scale = _data_scale(monkeypatch, _fake_multi30k(tmp_path / "multi30k"))
    work = tmp_path / "mine"
    (work / "cache").mkdir(parents=True)
    (work / "cache" / "keep.txt").write_text("the user's\n")
    (work / "train.en").write_text("the user's corpus\n")
    for stage in ("prepare_timings", "train_memory", "ddp_share", "write_report"):  # (nothing to measure here)
        monkeypatch.setattr(scale, stage, lambda *args: None)
    monkeypatch.setattr(sys, "argv", ["data_scale.py", "--work", str(work), "--pairs", "20", "--parts", "prepare",
                                      "--out", str(tmp_path / "out.md")])
    with pytest.raises(SystemExit) as stop:
        scale.main()
    assert stop.value.code == 2
    assert f"--work {work}: holds files this script did not write (cache/keep.txt, train.en)" in capsys.readouterr().err
    assert (work / "cache" / "keep.txt").read_text() == "the user's\n"
    assert (work / "train.en").read_text() == "the user's corpus\n"
    assert sorted(p.name for p in work.iterdir()) == ["cache", "train.en"]
    ours = tmp_path / "ours"  # an earlier call's directory is measured in again
    scale.generate(ours, 20)
    (ours / "cache" / "corpus-0123456789abcdef0123").mkdir(parents=True)
    (ours / "cache" / "corpus-0123456789abcdef0123.lock").touch()
    (ours / "run-big").mkdir()
    (ours / "run-big" / ".lock").touch()
    assert scale.foreign_in_work(ours) == []


@pytest.mark.slow  # two `sanlab prepare` calls on a tiny corpus
def test_data_scale_reads_the_encoding_time_and_tells_a_cached_corpus_apart(tmp_path, monkeypatch):
    """Its regex looked for "process(es), N s", which prepare's log never says; and "re-encoded anything" tested
    for the word "encoded", which the line of a corpus taken from the cache holds too."""
    scale = _data_scale(monkeypatch, _fake_multi30k(tmp_path / "multi30k"))
    work = tmp_path / "work"
    scale.generate(work, 200)
    config = scale.write_config(work, "tiny", work / "train.en", work / "train.de")
    env = {**os.environ, "SANLAB_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT / "src")}
    sets = ["--set", "data.subword.vocab_size=60", "--workers", "1"]
    _, _, first = scale.run(scale.sanlab("prepare", str(config), *sets), env)
    scale.encode_seconds(first)  # the line is found and read (a RuntimeError otherwise, as below)
    assert scale.encoded_anything(first)
    _, _, again = scale.run(scale.sanlab("prepare", str(config), *sets), env)
    assert "encoded earlier, from the cache" in again and not scale.encoded_anything(again)
    with pytest.raises(RuntimeError, match="no 'encoded ... with N process"):
        scale.encode_seconds(again)


def test_another_revisions_file_is_read_from_this_checkout_whatever_the_directory(tmp_path, monkeypatch, capsys):
    """git ran in the working directory (outside the checkout: 'not a git repository', a traceback), and an unknown
    revision was a CalledProcessError traceback."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from revisions import module_at_revision

    monkeypatch.chdir(tmp_path)
    old = module_at_revision("HEAD", "src/sanlab/decoding/search.py", "search_at_head_for_test")
    monkeypatch.delitem(sys.modules, "search_at_head_for_test")
    assert callable(old.beam_search) and Path(old.__file__).read_text().startswith('"""')
    with pytest.raises(SystemExit) as stopped:
        module_at_revision("no-such-revision", "src/sanlab/decoding/search.py", "never_loaded")
    assert stopped.value.code == 2
    assert "error: no src/sanlab/decoding/search.py at revision 'no-such-revision'" in capsys.readouterr().err


# (script, its required arguments) of every bench with --out; the refusal comes before anything is loaded
_WITH_OUT = [("grid_speed.py", ["configs/compare/smoke-synthetic.yaml"]),
             ("decode_speed.py", ["configs/compare/smoke-synthetic.yaml"]),
             ("gpu.py", ["configs/compare/csan-table1-multi30k.yaml", "--device", "cpu"]),
             ("char_cnn.py", ["configs/ud-ewt-tagger.yaml"]),
             ("trainer_versions.py", ["configs/ud-ewt-tagger.yaml", "--against", "HEAD"]),
             ("search_versions.py", ["--against", "HEAD"]),
             ("part_versions.py", ["configs/ud-ewt-tagger.yaml", "--against", "HEAD", "--module", "sanlab.attention.parts.rel_pos"]),
             ("variant_smoke.py", []),
             ("ddp_speed.py", []),
             ("data_scale.py", ["--work", "/nonexistent/work"])]


@pytest.mark.slow  # each script imports torch first (~4 s)
@pytest.mark.parametrize("script,args", _WITH_OUT, ids=[s for s, _ in _WITH_OUT])
def test_a_bench_refuses_to_write_its_table_over_a_file_it_did_not_write(tmp_path, script, args):
    """--out replaced whatever the path held (a results file of another tool, a source file after a typo)."""
    other = tmp_path / "notes.md"
    other.write_text("# my notes\n")
    done = _bench(script, *args, "--out", str(other))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"--out {other}: the file exists and is no report of bench/{script}" in done.stderr
    assert other.read_text() == "# my notes\n"


@pytest.mark.slow  # each script imports torch first (~4 s)
@pytest.mark.parametrize("script,args", [("train_step.py", []), ("attention_window.py", ["--quick"]),
                                         ("block_layer.py", []),
                                         ("decode_speed.py", ["configs/compare/smoke-synthetic.yaml"]),
                                         ("gpu.py", ["configs/compare/csan-table1-multi30k.yaml"])])
def test_a_bench_asked_for_cuda_without_it_says_so(script, args):
    """An AssertionError traceback ('Torch not compiled with CUDA enabled') from the first tensor moved."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = _bench(script, *args, "--device", "cuda")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "--device: device 'cuda': this torch" in done.stderr and "sees no CUDA device" in done.stderr


def test_bench_reports_name_the_cpu_model_and_are_written_whole(tmp_path, monkeypatch):
    """The machine line said 'Linux x86_64': not which CPU the timings are of; and --out was written in place."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import platform

    import report

    line = report.machine()
    assert report.cpu_model() in line and f"python {platform.python_version()}" in line and "torch " in line
    if Path("/proc/cpuinfo").exists() and "model name" in Path("/proc/cpuinfo").read_text():
        assert report.cpu_model() != platform.machine()
    out = tmp_path / "sub" / "table.md"
    report.write_out(out, "| a |\n")
    assert out.read_text() == "| a |\n" and [p.name for p in out.parent.iterdir()] == ["table.md"]  # no temp left


@pytest.mark.slow  # the bench imports torch and reads the grid before it refuses (~5 s)
def test_gpu_bench_refuses_a_tagging_grid():
    """It built a translation batch from a tagging config: an AttributeError traceback (no data.subword)."""
    done = _bench("gpu.py", "configs/compare/smoke-synthetic.yaml", "--device", "cpu", "--quick")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert ("configs/compare/smoke-synthetic.yaml: the GPU bench times translation models, this grid is tagging"
            in done.stderr)


@pytest.mark.slow  # each script imports torch first (~4 s)
@pytest.mark.parametrize("script,args", [
    ("grid_speed.py", ["configs/compare/smoke-synthetic.yaml", "--rounds", "0"]),
    ("train_step.py", ["--repeats", "0"]),
    ("block_layer.py", ["--rounds", "0"]),
    ("search_versions.py", ["--against", "HEAD", "--rounds", "0"]),
    ("gpu.py", ["configs/compare/csan-table1-multi30k.yaml", "--updates", "0"])])
def test_a_bench_refuses_zero_rounds_or_repeats(script, args):
    """Zero rounds measured nothing and ended in a traceback (statistics.median of nothing, a KeyError)."""
    done = _bench(script, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{args[-2]}: 0 is not a whole number of 1 or more" in done.stderr


@pytest.mark.slow  # the script imports torch first (~4 s)
@pytest.mark.parametrize("script", ["grid_speed.py", "decode_speed.py", "gpu.py"])
def test_a_bench_given_a_missing_grid_says_so_in_one_line(tmp_path, script):
    done = _bench(script, str(tmp_path / "no-grid.yaml"), "--device", "cpu") if script != "grid_speed.py" else \
        _bench(script, str(tmp_path / "no-grid.yaml"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == f"{script}: error: {tmp_path / 'no-grid.yaml'}: grid file not found"
