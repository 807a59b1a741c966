"""What a written config (--print-config, a run's config.yaml) keeps of the difference between a key a file sets
and one it inherits, so that a printed config is the same config to --set; and how a file over its base removes
one of the base's named entries (a test set)."""

from pathlib import Path

import pytest
import yaml

from sanlab.cli import main
from sanlab.config import dump_config, load_config

TRANSLATION = ("task: translation\ndata:\n  train: {src: a, tgt: b}\n  valid: {src: a, tgt: b}\n"
               "model:\n  dim: 16\n  decoder:\n    attention: {heads: 2, dropout: 0.1, bias: false}\n"
               "    cross_attention: {parts: [{type: rel_pos, cross: true}]}\n")
INHERITED = ("heads", "dropout", "bias", "out_proj")  # every key of the cross-attention but its parts and plan


def _printed(path: Path, capsys, *overrides: str) -> str:
    assert main(["train", str(path), *[a for o in overrides for a in ("--set", o)], "--print-config"]) == 0, \
        capsys.readouterr().err
    return capsys.readouterr().out


@pytest.mark.parametrize("override, key, value", [("model.decoder.attention.heads=4", "heads", 4),
                                                  ("model.decoder.attention.dropout=0.3", "dropout", 0.3),
                                                  ("model.decoder.attention.bias=true", "bias", True),
                                                  ("model.decoder.attention.out_proj=false", "out_proj", False)])
def test_a_printed_config_is_the_same_config_to_set(tmp_path, capsys, override, key, value):
    """--print-config wrote the keys the cross-attention inherits from the decoder's attention as if the file set
    them: the printed file with --set model.decoder.attention.heads=4 kept the cross-attention's 2 heads, the
    original gave it 4. Print, then reuse, must not change what a --set means."""
    original = _file(tmp_path, TRANSLATION, "original.yaml")
    printed = _file(tmp_path, _printed(original, capsys), "printed.yaml")
    assert load_config(printed) == load_config(original)
    from_original, from_printed = load_config(original, [override]), load_config(printed, [override])
    assert getattr(from_original.model.decoder.cross_attention, key) == value
    assert from_printed.model_dump() == from_original.model_dump()
    assert _printed(printed, capsys, override) == _printed(original, capsys, override)


def test_a_written_config_leaves_out_inherited_keys_and_keeps_the_ones_set(tmp_path):
    config = load_config(_file(tmp_path, TRANSLATION.replace("{parts:", "{heads: 1, parts:")))
    cross = yaml.safe_load(dump_config(config))["model"]["decoder"]["cross_attention"]
    assert cross["heads"] == 1 and not set(INHERITED[1:]) & set(cross), cross  # set: written; inherited: not
    assert config.model.decoder.cross_attention.dropout == 0.1  # the config itself holds the inherited values
    assert config.model_dump()["model"]["decoder"]["cross_attention"]["bias"] is False


def _file(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_run_whose_config_yaml_spells_inherited_keys_out_resumes(tmp_path):
    """A run directory's config.yaml written before inherited keys were left out holds the cross-attention's
    inherited keys as set: the run resumes from the same file it was started from (the values compare, not the
    spelling), and its config.yaml is left as it was."""
    from sanlab.config_yaml import dump_yaml
    from sanlab.runs.resume import load_run_config, prepare_run_dir

    config = load_config(_file(tmp_path, TRANSLATION))
    run = tmp_path / "run"
    prepare_run_dir(run, config, overwrite=False)
    old_style = dump_yaml(config.model_dump(mode="json"))  # what dump_config wrote before
    assert "out_proj" in yaml.safe_load(old_style)["model"]["decoder"]["cross_attention"]
    (run / "config.yaml").write_text(old_style)
    assert load_run_config(run) == config
    assert prepare_run_dir(run, config, overwrite=False) is False  # no differing key (and nothing trained yet)
    assert (run / "config.yaml").read_text() == old_style
    longer = load_config(tmp_path / "c.yaml", ["train.max_steps=200000"])
    prepare_run_dir(run, longer, overwrite=False)  # a resumable key changed: the file is written again
    assert (run / "config.yaml").read_text() == dump_config(longer)
    with pytest.raises(Exception, match="differing keys: model.decoder.cross_attention.heads"):
        prepare_run_dir(run, load_config(tmp_path / "c.yaml", ["model.decoder.cross_attention.heads=1"]),
                        overwrite=False)


# ----------------------------------------------------------------------------- removing a base's named entry
BASE = ("task: translation\ndata:\n  train: {src: a, tgt: b}\n  valid: {src: a, tgt: b}\n"
        "  test:\n    t1: {src: t1.en, tgt: t1.de}\n    t2: {src: t2.en, tgt: t2.de}\n")


def test_a_file_over_its_base_removes_a_test_set_with_null(tmp_path):
    """A file could add test sets to its base's or change them, never remove one (`{}` adds nothing in a file;
    --set could empty the section and list the rest again). `NAME: null` removes the entry, in a file as in --set."""
    _file(tmp_path, BASE, "base.yaml")
    child = _file(tmp_path, "base: base.yaml\ndata:\n  test:\n    t1: null\n    t3: {src: t3.en, tgt: t3.de}\n")
    assert list(load_config(child).data.test) == ["t2", "t3"]
    both = _file(tmp_path, "base: base.yaml\ndata: {test: {t1: null, t2: null}}\n", "both.yaml")
    assert load_config(both).data.test == {}
    again = _file(tmp_path, "base: c.yaml\ndata: {test: {t1: {src: x.en, tgt: x.de}}}\n", "again.yaml")
    assert {k: v.src for k, v in load_config(again).data.test.items()} == {"t2": "t2.en", "t3": "t3.en", "t1": "x.en"}


@pytest.mark.parametrize("how", [["data.test.t1=null"], ["data.test={t1: null}"], ["data={test: {t1: null}}"]])
def test_set_removes_a_test_set_with_the_same_null(tmp_path, how):
    assert list(load_config(_file(tmp_path, BASE), how).data.test) == ["t2"]


def test_a_grid_s_set_removes_a_test_set_with_the_same_null(tmp_path):
    from sanlab.experiments.grid import load_grid

    _file(tmp_path, BASE, "recipe.yaml")
    grid = _file(tmp_path, "base: recipe.yaml\nseeds: [1]\nset: {data.test.t1: null}\nvariants:\n"
                           "  - {name: a, overrides: []}\n  - {name: b, overrides: [data.test.t2=null]}\n", "grid.yaml")
    cells = load_grid(grid, runs_dir=tmp_path / "runs").cells
    assert [list(c.config.data.test) for c in cells] == [["t2"], []]


def test_removing_an_entry_that_is_not_there_names_the_file_line_and_the_entries_there(tmp_path, capsys):
    _file(tmp_path, BASE, "base.yaml")
    child = _file(tmp_path, "base: base.yaml\ndata:\n  test:\n    t9: null\n")
    assert main(["train", str(child), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert f"{child}, line 4: data.test.t9: null removes the entry 't9' of data.test, which has none of that name " \
           "(its entries: t1, t2)" in err, err
    assert main(["train", str(tmp_path / "base.yaml"), "--set", "data.test.t9=null", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "--set data.test.t9: null removes the entry 't9' of data.test, which has none of that name (its entries: " \
           "t1, t2)" in err, err
    alone = _file(tmp_path, BASE.split("  test:")[0] + "  test: {t9: null}\n", "alone.yaml")  # no base: none
    assert main(["train", str(alone), "--print-config"]) == 2
    assert f"{alone}, line 5: data.test.t9: null removes the entry 't9' of data.test, which has none" in \
        capsys.readouterr().err


def test_null_keeps_its_meaning_where_a_key_is_not_a_named_entry(tmp_path):
    """Only the entries of a mapping of names (data.test's test sets) are removed by null: elsewhere null is the
    value null, whether the base sets the key or not (a window part's `layers: null` is every layer, not the
    default [0, 1, 2]; a tagger's `data.test: null` is no test treebank)."""
    _file(tmp_path, BASE + "  max_ratio: 2.0\nmodel:\n  encoder:\n    attention: {parts: [{type: window, layers: [0]}]}\n"
                           "  decoder: {cross_attention: {heads: 2}}\n", "base.yaml")
    child = _file(tmp_path, "base: base.yaml\ndata: {max_ratio: null, skip_empty: false}\n"
                            "model: {decoder: {cross_attention: null}}\n")
    config = load_config(child, ["model.encoder.attention.parts.0.layers=null"])
    assert (config.data.max_ratio, config.model.decoder.cross_attention) == (None, None)
    assert config.model.encoder.attention.parts[0].layers is None
    with pytest.raises(Exception, match="train.lr"):
        load_config(child, ["train.lr=null"])  # refused as before, not the default
    _file(tmp_path, "task: tagging\ndata: {train: a, dev: b, test: c}\n", "tagging.yaml")
    tagging = _file(tmp_path, "base: tagging.yaml\ndata: {test: null}\n", "tagging-child.yaml")
    assert load_config(tagging).data.test is None
