"""What a written config (--print-config, a run's config.yaml) keeps of the difference between a key a file sets
and one it inherits, so that a printed config is the same config to --set."""

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

