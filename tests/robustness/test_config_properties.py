"""Property-based tests of the config loader (issue 27): any YAML file, any value under any key, any
``--set`` text gives a validated config or a ConfigError naming the problem; never another exception.
A quoted number or bool in YAML is a string, and the typed config refuses it (``--set`` values are parsed
as YAML, so ``--set model.dropout=0.1`` stays a number)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sanlab.config import dump_config, load_config, set_key, validate
from sanlab.errors import ConfigError

# a deadline of 5 s per example fails one that is slow (measured after it ends); a real hang is ended by
# the module's timeout (pytest-timeout), so it fails instead of stopping the suite
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # (hundreds of examples: make test runs them)
FAST = settings(max_examples=120, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
BASE = {"task": "translation", "data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "a", "tgt": "b"}},
        "model": {"dim": 16, "encoder": {"layers": 1, "attention": {"heads": 2}}}}
_names = itertools.count()


def _leaves(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for k, v in d.items():
        out += _leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [(f"{prefix}{k}", v)]
    return out


LEAVES = _leaves(yaml.safe_load(dump_config(validate(BASE, source="base"))))
TYPED = [(k, v) for k, v in LEAVES if isinstance(v, (bool, int, float)) and k != "task"]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("configs")


def _load(path: Path, overrides=()):
    try:
        return load_config(path, list(overrides))
    except ConfigError as err:
        assert str(err).strip(), "an empty message"
        return None


values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                      max_leaves=6)


@FAST
@given(st.text(max_size=200))
def test_any_text_is_a_config_or_a_config_error(scratch, text):
    path = scratch / f"c{next(_names)}.yaml"
    path.write_text(text, encoding="utf-8")
    _load(path)


@settings(FAST, max_examples=60)  # each example validates a whole config twice
@given(st.sampled_from([k for k, _ in LEAVES] + ["model.encoder.attention.parts", "train.nokey", "base", "data"]),
       values)
def test_any_value_under_any_key_is_validated_or_refused(scratch, key, value):
    raw = yaml.safe_load(dump_config(validate(BASE, source="base")))
    set_key(raw, key, value)
    path = scratch / f"c{next(_names)}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    config = _load(path)
    assert config is None or config.task == "translation"


@FAST
@given(st.text(max_size=60))
def test_any_set_text_is_applied_or_refused(scratch, assignment):
    path = scratch / f"c{next(_names)}.yaml"
    path.write_text(yaml.safe_dump(BASE), encoding="utf-8")
    _load(path, [assignment])


@FAST
@given(st.sampled_from(TYPED))
def test_a_quoted_number_or_bool_is_refused_and_the_same_value_by_set_is_not(scratch, leaf):
    key, value = leaf
    text = yaml.safe_dump(value)
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    set_key(raw, key, text.split("\n")[0])  # the YAML text of the value, as a (quoted) string
    path = scratch / f"c{next(_names)}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: .*a quoted value is a string in YAML"):
        load_config(path)
    plain = scratch / f"c{next(_names)}.yaml"
    plain.write_text(yaml.safe_dump(BASE), encoding="utf-8")
    assert _leaves(load_config(plain, [f"{key}={text.split(chr(10))[0]}"]).model_dump(mode="json"))


def test_the_issues_quoted_values_are_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(BASE) + "train: {label_smoothing: '0.1'}\n")
    with pytest.raises(ConfigError, match=r"train.label_smoothing: Input should be a valid number.*quoted.*got '0.1'"):
        load_config(path)
    raw = {**BASE, "model": {**BASE["model"], "dropout": "0.1", "tie_output": "no"}}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "model.dropout" in str(info.value) and "model.tie_output" in str(info.value)
    path.write_text(yaml.safe_dump(BASE))
    config = load_config(path, ["model.dropout=0.3", "model.tie_output=no", "train.betas=[0.9, 0.99]", "train.lr=1e39"])
    assert (config.model.dropout, config.model.tie_output, config.train.betas) == (0.3, False, (0.9, 0.99))
    assert config.train.lr == 1e39  # YAML 1.1 would read 1e39 (no dot) as a string
    path.write_text(yaml.safe_dump(BASE) + "train: {lr: 5e-4, eps: 1E-9}\n")
    assert (load_config(path).train.lr, load_config(path).train.eps) == (5e-4, 1e-9)
    path.write_text(yaml.safe_dump(BASE) + "train: {lr: fast}\n")
    with pytest.raises(ConfigError) as info:  # a word where a number belongs: no hint about quotes
        load_config(path)
    assert "train.lr: Input should be a valid number (got 'fast')" in str(info.value)


@pytest.mark.parametrize("part,field", [({"type": "window", "size": "11"}, "size"),
                                        ({"type": "window", "layers": ["0", 1]}, "layers"),
                                        ({"type": "csan2d", "heads_area": 3.0}, "heads_area")])
def test_component_fields_are_as_strict_as_the_rest(part, field):
    """A part's fields are typed as strictly as the run config's: a quoted number is refused there too."""
    raw = {**BASE, "model": {"encoder": {"attention": {"parts": [part]}}}}
    with pytest.raises(ConfigError, match=field):
        validate(raw, source="t")


# any text, and text spelt as a number, a bool or null in YAML 1.1 or 1.2 (1e5, 0o17, 0x1f, 1_000, 1:30, no, ~)
STRINGS = st.one_of(
    st.text(max_size=12),
    st.tuples(st.integers(0, 99), st.integers(-9, 9)).map(lambda t: f"{t[0]}e{t[1]}"),
    st.integers(0, 4095).map(lambda n: f"{n:#o}"), st.integers(0, 4095).map(lambda n: f"{n:#x}"),
    st.integers(0, 10**6).map(lambda n: f"{n:_}"), st.floats(allow_nan=False).map(str),
    st.sampled_from(["yes", "no", "on", "off", "null", "~", "1:30", ".inf", "-.5", "+1", ""]))


@settings(FAST, max_examples=200)
@given(STRINGS, STRINGS)
def test_the_saved_config_reads_back_as_it_was(scratch, name, text):
    """Whatever the strings of a config, its dump_config (a run's config.yaml) loads back to the same config:
    every string the loader would read as a number, a bool or null is quoted."""
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    raw["data"]["valid"] = {"src": text, "tgt": name}
    raw["data"]["test"] = {name: {"src": text, "tgt": text}}
    config = validate(raw, source="t")
    path = scratch / f"c{next(_names)}.yaml"
    path.write_text(dump_config(config), encoding="utf-8")
    assert load_config(path).model_dump() == config.model_dump()
