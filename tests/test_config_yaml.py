"""Config files are parsed by libyaml's C parser where PyYAML was built with it (several times faster than
PyYAML's own; a run reads its config.yaml and the presets of its base chain many times), with the same loader
rules; a file the C parser refuses is read again by PyYAML's parser, whose message and position are the ones
reported (tests/test_cli.py: test_broken_config_files_are_named)."""

from pathlib import Path

import pytest
import yaml

from sanlab import config_yaml
from sanlab.config_yaml import read_yaml_mapping

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted([*ROOT.glob("configs/**/*.yaml"), *config_yaml.PRESETS.glob("*.yaml")])


def _loaders_used(monkeypatch, path: Path) -> list[type]:
    used, load = [], yaml.load

    def spy(stream, Loader):  # noqa: N803 (PyYAML's name)
        used.append(Loader)
        return load(stream, Loader=Loader)

    monkeypatch.setattr(yaml, "load", spy)
    read_yaml_mapping(path)
    return used


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="this PyYAML was built without libyaml")
def test_a_config_file_is_parsed_by_libyaml(monkeypatch):
    [loader] = _loaders_used(monkeypatch, SHIPPED[0])
    assert issubclass(loader, yaml.CSafeLoader)


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="this PyYAML was built without libyaml")
def test_a_file_libyaml_refuses_is_read_again_by_pyyaml_for_its_message(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("task: tagging\nx: [1, 2\n")  # libyaml: "did not find expected ',' or ']'"
    used = []
    load = yaml.load

    def spy(stream, Loader):  # noqa: N803 (PyYAML's name)
        used.append(Loader)
        return load(stream, Loader=Loader)

    monkeypatch.setattr(yaml, "load", spy)
    with pytest.raises(Exception, match=r"line 3, column 1: not valid YAML: .*expected ',' or '\]', but got "
                                        r"'<stream end>'"):
        read_yaml_mapping(path)
    assert used == [config_yaml._FastUniqueKeyLoader, config_yaml._UniqueKeyLoader]


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="this PyYAML was built without libyaml")
@pytest.mark.parametrize("text", [
    "lr: 1e-3\nseed: 0123\nhex: 0x10\nclock: 1:30\nsize: 1_000\n",   # YAML 1.2 numbers, not PyYAML's 1.1
    "2016: {src: a}\n0x10: b\n",                                     # a key is a name
    "base: &b {x: 1, y: [1, 2]}\nover: {<<: *b, y: 3}\nflag: no\nday: 2016-01-01\n",
])
def test_libyaml_and_pyyaml_read_the_same_values(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert read_yaml_mapping(path) == yaml.load(text, Loader=config_yaml._UniqueKeyLoader)


@pytest.mark.skipif(not yaml.__with_libyaml__, reason="this PyYAML was built without libyaml")
def test_every_shipped_config_reads_the_same_with_either_parser():
    assert len(SHIPPED) > 20
    for path in SHIPPED:
        text = path.read_text(encoding="utf-8")
        assert read_yaml_mapping(path) == yaml.load(text, Loader=config_yaml._UniqueKeyLoader), path


@pytest.mark.parametrize("text, refused", [
    ("task: tagging\ntrain:\n  max_steps:\t3\n", r"line 3, column 13: not valid YAML: .*'\\t' that cannot start"),
    ("task: tagging\nnote: {why?: x}\n", r"line 2, column 11: not valid YAML: .*got .\?."),
    ("task: tagging\nnote: [b?]\n", r"line 2, column 9: not valid YAML: .*got .\?."),
    ("task: tagging\nnote: |# why\n  text\n", r"line 2, column 8: not valid YAML: .*block scalar"),
    ("task: tagging\nnote: [0, !, 2]\n", r"line 2, column 11: not valid YAML"),
])
def test_what_only_libyaml_accepts_is_refused_as_pyyaml_refuses_it(tmp_path, text, refused):
    """libyaml accepts a tab after a key and a `?` in a flow collection; PyYAML refuses both, naming the line: such
    a file loaded through libyaml, and then every validation error in it came without its line (key_line parses
    with PyYAML). Texts with these characters are PyYAML's (``config_yaml._PYYAML_ONLY``)."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(Exception, match=refused):
        read_yaml_mapping(path)


def test_a_byte_order_mark_inside_the_file_reads_as_pyyaml_reads_it(tmp_path):
    """libyaml skips a byte-order mark at the start of any line (files joined with cat), PyYAML keeps it in the key:
    `model:\\n\\ufeff  max_len: 7` was an empty `model` and an unknown key, refused, and libyaml read max_len 7."""
    text = "model:\n\ufeff  max_len: 7\n"
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    assert read_yaml_mapping(path) == {"model": None, "\ufeff  max_len": 7}


def test_every_shipped_config_takes_the_fast_parser():
    """What goes to PyYAML's parser alone (a tab, a `?`, a byte-order mark past the start) is in no shipped file."""
    assert not [path for path in SHIPPED if config_yaml._PYYAML_ONLY.search(path.read_text(encoding="utf-8"))]


@pytest.mark.parametrize("value, kind", [("!!int x", "int"), ("!!float abc", "float"), ("!!bool maybe", "bool"),
                                         ("!!timestamp x", "timestamp")])
def test_an_explicit_tag_on_what_it_cannot_read_names_the_line(tmp_path, value, kind):
    """It was a ValueError, KeyError or AttributeError traceback."""
    path = tmp_path / "c.yaml"
    path.write_text(f"task: tagging\ntrain: {{max_steps: {value}}}\n")
    with pytest.raises(Exception, match=rf"line 2, column 20: not valid YAML: .* is not a valid {kind}"):
        read_yaml_mapping(path)


def test_a_bare_tag_reads_as_pyyaml_reads_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("task: tagging\nnote: !\n")  # libyaml: '', PyYAML: None
    assert read_yaml_mapping(path) == {"task": "tagging", "note": None}


def test_a_tab_is_refused_with_what_yaml_wants_instead(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("task: tagging\ntrain:\n\tmax_steps: 3\n")
    with pytest.raises(Exception, match=r"line 3, column 1: not valid YAML: .*'\\t' that cannot start any token; "
                                        r"YAML indents with spaces, not tabs"):
        read_yaml_mapping(path)
