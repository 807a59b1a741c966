"""``sanlab compare``'s grid files: the mistakes a grid can hold and how each is named, the seed filter, and the
shipped grids (every row its configs/ recipe but for documented differences, every cell resolvable), the order
cells run in, and worker processes dying with the grid process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sanlab.errors import ConfigError
from sanlab.experiments.compare import run_order, select_cells
from sanlab.experiments.grid import load_grid

from compare_fixtures import TAGGER, write

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- bad grids
def test_unknown_variant_key_names_the_grid_and_the_variant(tmp_path):
    write(tmp_path / "tagger.yaml", TAGGER)
    bad = write(tmp_path / "bad.yaml", "base: tagger.yaml\nseeds: [1]\nvariants:\n  - {name: a}\n"
                                        "  - {name: b, overides: [model.dropout=0.2]}\n")
    with pytest.raises(ConfigError) as err:
        load_grid(bad)
    assert str(bad) in str(err.value) and "variant 'b' (variants[1]).overides: unknown key" in str(err.value)



def test_grid_mistakes_name_their_line_suggest_a_key_and_name_an_unnamed_variant(tmp_path):
    write(tmp_path / "tagger.yaml", TAGGER)
    bad = write(tmp_path / "bad.yaml", "base: tagger.yaml\nseeds: [1]\nvariants:\n  - {name: a, overides: []}\n"
                                        "  - {seeds: [1]}\nevals: {checkpoint: best}\n")
    with pytest.raises(ConfigError) as err:
        load_grid(bad)
    message = str(err.value)
    assert "variant 'a' (variants[0]).overides: unknown key (did you mean overrides?) (line 4)" in message
    assert "the variant without a name (variants[1]).name: Field required (line 5)" in message
    assert "evals: unknown key (did you mean eval?) (line 6)" in message and "None" not in message

def test_unknown_config_key_in_overrides_names_the_grid_variant_and_key(tmp_path):
    write(tmp_path / "tagger.yaml", TAGGER)
    bad = write(tmp_path / "bad.yaml", "base: tagger.yaml\nseeds: [1]\nvariants:\n  - {name: a}\n"
                                        "  - {name: b, overrides: ['model.encoder.atention.heads=2']}\n")
    with pytest.raises(ConfigError) as err:
        load_grid(bad)
    message = str(err.value)
    assert str(bad) in message and "variant 'b'" in message and "model.encoder.atention: unknown key" in message
    assert ("model.encoder.atention: unknown key (did you mean attention or cross_attention?) (from the overrides "
            "of variant 'b')") in message


def test_a_variant_that_cannot_be_built_fails_when_the_grid_loads(tmp_path):
    """Not hours later, when its cell's turn to train comes: the message names the grid file and variant."""
    write(tmp_path / "tagger.yaml", TAGGER)
    bad = write(tmp_path / "bad.yaml", "base: tagger.yaml\nseeds: [1]\nvariants:\n  - {name: a}\n  - name: b\n"
                                        "    overrides: ['model.encoder.attention.parts=[{type: csan2d, heads_area: 5}]',"
                                        " model.encoder.attention.heads=4]\n")
    with pytest.raises(ConfigError) as err:
        load_grid(bad)
    assert str(err.value).startswith(f"{bad}: variant 'b' (base tagger.yaml): this model cannot be built:")


@pytest.mark.parametrize("where, expected", [
    ("recipe", "model.word_dimm: unknown key (did you mean word_dim?) (set in {base}, line 3)"),
    ("set", "model.word_dimm: unknown key (did you mean word_dim?) (from the grid's set:)"),
    ("cli", "model.word_dimm: unknown key (did you mean word_dim?) (from --set)")])
def test_an_invalid_key_of_a_cell_is_traced_to_where_it_was_set(tmp_path, where, expected):
    """Down the recipe's base chain to its file and line, or to the grid's layer that set it."""
    write(tmp_path / "tagger.yaml", TAGGER)
    base = write(tmp_path / "mid.yaml", "base: tagger.yaml\ntrain: {batch_size: 4}\n"
                                         + ("model: {word_dimm: 3}\n" if where == "recipe" else ""))
    grid = write(tmp_path / "g.yaml", "base: mid.yaml\nseeds: [1]\nvariants:\n  - {name: a}\n"
                                       + ("set: [model.word_dimm=3]\n" if where == "set" else ""))
    with pytest.raises(ConfigError) as err:
        load_grid(grid, overrides=["model.word_dimm=3"] if where == "cli" else [])
    assert expected.format(base=base) in str(err.value)


def test_a_set_mapping_is_blamed_only_for_the_keys_it_sets(tmp_path):
    """set: {model: {...}} merges into the model key by key: a bad key a variant's overrides put beside them is
    the variant's, not the grid's set:."""
    write(tmp_path / "tagger.yaml", TAGGER)
    grid = write(tmp_path / "g.yaml", "base: tagger.yaml\nseeds: [1]\nset: {model: {word_dim: 8}}\nvariants:\n"
                                       "  - {name: a, overrides: ['model.word_dimm=3']}\n")
    with pytest.raises(ConfigError) as err:
        load_grid(grid)
    assert "model.word_dimm: unknown key (did you mean word_dim?) (from the overrides of variant 'a')" in str(err.value)
    with pytest.raises(ConfigError) as err:  # and where the mapping holds the bad key, it is set:'s
        load_grid(write(tmp_path / "g.yaml", "base: tagger.yaml\nseeds: [1]\nset: {model: {word_dimm: 8}}\n"
                                              "variants:\n  - {name: a}\n"))
    assert "model.word_dimm: unknown key (did you mean word_dim?) (from the grid's set:)" in str(err.value)


def _synthetic_multi30k_grid(tmp_path, *, runs_dir):
    """The Multi30k recipe as a grid on a tiny synthetic corpus, one variant, one seed."""
    return load_grid(write(tmp_path / "g.yaml", f"""\
base: {ROOT / "configs" / "multi30k-en-de-transformer.yaml"}
synthetic: {{task: translation, sizes: {{train: 10, valid: 5, test: 5}}}}
seeds: [1]
variants:
  - {{name: a}}
"""), runs_dir=runs_dir)


def test_synthetic_data_replaces_the_recipes_test_sets(tmp_path):
    """The Multi30k recipe's test_2016_flickr must not survive as the default eval split of a synthetic grid."""
    grid = _synthetic_multi30k_grid(tmp_path, runs_dir=tmp_path / "runs")
    (cell,) = grid.cells
    assert list(cell.config.data.test) == ["test"] and cell.split == "test"
    assert cell.config.data.test["test"].src == str(tmp_path / "runs" / "data" / "test.src")


def test_synthetic_data_never_replaces_a_users_corpus_in_runs_dir_data(tmp_path):
    """`runs_dir: .` in a project whose data/ holds the user's train.src: the grid wrote its synthetic corpus
    over it. A file there that is not the grid's own is an error; the grid's own (a start killed before
    synthetic.json) is kept."""
    from sanlab.experiments.cells import prepare_synthetic

    grid = _synthetic_multi30k_grid(tmp_path, runs_dir=tmp_path / "project")
    data = tmp_path / "project" / "data"
    data.mkdir(parents=True)
    (data / "train.src").write_text("the user's corpus\n")
    with pytest.raises(ConfigError, match=r"data/train.src: exists and is not the grid's synthetic corpus"):
        prepare_synthetic(grid)
    assert (data / "train.src").read_text() == "the user's corpus\n"
    assert sorted(p.name for p in data.iterdir()) == ["train.src"]
    (data / "train.src").unlink()
    prepare_synthetic(grid)
    made = {p.name: p.read_bytes() for p in data.iterdir()}
    (data / "synthetic.json").unlink()  # killed before the stamp: the same corpus again, accepted
    prepare_synthetic(grid)
    assert {p.name: p.read_bytes() for p in data.iterdir()} == made


def test_other_grid_mistakes_are_named(tmp_path):
    write(tmp_path / "tagger.yaml", TAGGER)
    head = "base: tagger.yaml\nseeds: [1]\n"
    cases = {"variants:\n  - {name: a}\neval: {split: test}\n": "eval split 'test' is not in this run's data",
             "variants:\n  - {name: a, baseline: true}\n  - {name: b, baseline: true}\n": "more than one variant",
             "variants:\n  - {name: A-1}\n  - {name: a 1}\n": "collide",
             "variants:\n  - {name: a}\neval: {checkpoint: averaged}\n": "average_last",
             "set: {train.keep_last: 2}\nvariants:\n  - {name: a}\neval: {checkpoint: averaged, average_last: 3}\n":
                 r"variant 'a': eval.average_last 3 > train.keep_last 2; the run would not keep"}
    for body, expected in cases.items():
        with pytest.raises(ConfigError, match=expected):
            load_grid(write(tmp_path / "g.yaml", head + body))
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match="afile: is a file, not a directory for the grid's cells"):
        load_grid(write(tmp_path / "g.yaml", head + "variants:\n  - {name: a}\n"), runs_dir=tmp_path / "afile")
    grid = load_grid(write(tmp_path / "g.yaml", head + "variants:\n  - {name: a}\n"))
    with pytest.raises(ConfigError, match="no variant 'zzz'; the grid has: a"):
        select_cells(grid, only=["zzz"])


def test_seed_filter_picks_the_seed_of_every_chosen_variant_that_has_it(tmp_path):
    write(tmp_path / "tagger.yaml", TAGGER)
    grid = load_grid(write(tmp_path / "g.yaml", "base: tagger.yaml\nseeds: [1]\nvariants:\n"
                            "  - {name: base, baseline: true, seeds: [1, 2, 3]}\n  - {name: b}\n"
                            "  - {name: c, seeds: [1, 2]}\n"))
    label = lambda cells: [(c.variant, c.seed) for c in cells]  # noqa: E731
    assert label(select_cells(grid, seeds=[2])) == [("base", 2), ("c", 2)]
    assert label(select_cells(grid, only=["base"], seeds=[3, 2])) == [("base", 3), ("base", 2)]  # as given
    assert len(select_cells(grid)) == 6
    with pytest.raises(ConfigError, match="no cell with seed 3 among the chosen variants; their seeds: 1, 2"):
        select_cells(grid, only=["b", "c"], seeds=[1, 3])


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


@pytest.mark.slow  # a spawned worker that imports torch: ~5 s
def test_a_grid_workers_library_warning_is_printed_as_the_commands_own(capfd):
    """A `--jobs` worker (spawned: no handler of the grid process) printed the bare message through Python's last
    resort; it prints "WARNING: ..." as the grid process does (cli.main's handler)."""
    import logging
    import os
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from sanlab.experiments.cells import init_worker

    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=init_worker,
                             initargs=(1, 1, os.getpid())) as pool:
        pool.submit(logging.getLogger("sanlab.runs.trained").warning, "the average is stale").result()
    assert capfd.readouterr().err == "WARNING: the average is stale\n"
