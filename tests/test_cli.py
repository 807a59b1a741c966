"""The command line: every subcommand has --help; user errors are one clear line, exit code 2."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from sanlab.cli import main
from sanlab.experiments.grid import load_grid

SUBCOMMANDS = ["train", "prepare", "translate", "tag", "evaluate", "env", "average", "demo", "params", "analyze",
               "compare"]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert "usage: sanlab " + command in capsys.readouterr().out


def _options(parser, name="sanlab"):
    """(command, option) of every option of ``parser`` and its subcommands, ``sanlab analyze sweep``'s included."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _options(subparser, f"{name} {sub}")
        elif action.option_strings:
            yield name, action


def test_an_option_whose_help_speaks_of_n_shows_n_in_the_usage():
    """`--last N` reads as "average the last N checkpoints"; `--last LAST` left the N of the help unnamed."""
    import re

    from sanlab.cli import _parser

    unnamed = [f"{command} {action.option_strings[-1]} {action.metavar or action.dest.upper()}"
               for command, action in _options(_parser())
               if action.help and re.search(r"(?<![-:])\bN\b", action.help) and action.metavar != "N"]
    assert not unnamed, f"options whose help says N but whose usage does not: {unnamed}"


def test_the_summary_of_evaluate_does_not_leave_out_the_dev_split_it_scores(capsys):
    """`sanlab --help` said evaluate scores "its test splits"; by default a tagging run's evaluation scores dev too
    (as its --split help says)."""
    with pytest.raises(SystemExit):
        main(["--help"])
    summary = " ".join(capsys.readouterr().out.split("\n    evaluate", 1)[1].split("\n    env", 1)[0].split())
    assert "test splits" not in summary and "--split" in summary, summary


def test_prepare_workers_help_names_the_size_that_chooses_the_default():
    """The default is chosen by the source file's size as stored (translation_data.PARALLEL_ABOVE_BYTES), not by
    its pairs: "over 200,000 pairs" was wrong for the recipes' gzip-compressed files, which hold far more below it."""
    from sanlab.cli import _parser
    from sanlab.tasks.translation_data import PARALLEL_ABOVE_BYTES

    said = next(a.help for command, a in _options(_parser()) if command == "sanlab prepare" and "--workers" in
                a.option_strings)
    assert f"over {PARALLEL_ABOVE_BYTES // 2**20} MiB as stored" in said, said


def test_compare_stop_after_help_says_how_the_invocation_ends(capsys):
    """It said what stops, not what the invocation then says and returns: the closing NOT FINISHED line naming the
    cells the limit left, the exit status 0 when only the limit left cells, and the rerun that goes on."""
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    said = " ".join(capsys.readouterr().out.split("\n  --stop-after DURATION", 1)[1].split("\n  --", 1)[0].split())
    assert "a unit is required" in said, said
    assert 'ends with a line naming them, e.g. "NOT FINISHED: 2 cell(s) left by --stop-after 9m' in said, said
    assert "the exit status is 0 where only the limit left cells (1 if a cell failed)" in said, said
    assert "rerun the same command to go on" in said, said


@pytest.mark.parametrize("argv, said", [
    (["train", "c.yaml", "--run", "r"], "sanlab train: interrupted; rerun the same command to resume\n"),
    (["train", "c.yaml", "--run", "r", "--overwrite"],  # the same command would empty the run and start it again
     "sanlab train: interrupted; rerun the command without --overwrite to resume (with it, the run starts again "
     "from update 0)\n"),
    (["compare", "g.yaml"], "sanlab compare: interrupted; rerun the same command to resume\n"),
    (["evaluate", "--run", "r"], "sanlab evaluate: interrupted\n"),
    (["translate", "--run", "r"], "sanlab translate: interrupted\n")])
def test_ctrl_c_says_resume_only_where_the_same_command_resumes(argv, said, monkeypatch, capsys):
    """train and compare pick up where they stopped; evaluate, translate and the others start again, so "rerun
    the same command to resume" would promise what they do not do."""
    import sanlab.cli
    import sanlab.experiments.compare_cli

    def interrupted(args):
        raise KeyboardInterrupt
    module = sanlab.experiments.compare_cli if argv[0] == "compare" else sanlab.cli
    monkeypatch.setattr(module, f"_cmd_{argv[0]}", interrupted)
    assert main(argv) == 130
    assert capsys.readouterr().err == said


@pytest.mark.parametrize("argv, usage, said", [
    (["train", "c.yaml", "--foo", "1"], "usage: sanlab train ", "sanlab train: error: unrecognized arguments: --foo 1\n"),
    (["evaluate", "--run", "r", "--splitt", "test"], "usage: sanlab evaluate ",
     "unrecognized arguments: --splitt test (did you mean --split?)"),
    (["analyze", "sweep", "r", "--key", "k", "--out", "o", "--froom=eval"], "usage: sanlab analyze sweep ",
     "sanlab analyze sweep: error: unrecognized arguments: --froom=eval (did you mean --from?)")])
def test_an_unknown_option_is_named_with_its_subcommands_usage(argv, usage, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(usage) and said in err


def test_console_script_is_installed():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "sanlab"]
    assert script.value == "sanlab.cli:main"
    installed = Path(sys.executable).parent / "sanlab"  # the script pip wrote next to this interpreter
    out = subprocess.run([str(installed) if installed.exists() else "sanlab", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "train" in out.stdout


def _config(tmp_path, body):
    path = tmp_path / "c.yaml"
    path.write_text(body)
    return str(path)


def test_unknown_config_key_is_named(tmp_path, capsys):
    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\nmodel: {word_dimm: 3}\n")
    assert main(["train", path, "--run", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "model.word_dimm: unknown key" in err and path in err


def test_a_key_set_in_a_base_file_is_traced_to_that_file(tmp_path, capsys):
    """A typo inside a ``base:`` file is named with the file that has it, not only the config given; a key the
    config itself sets, or --set gives, is not attributed to a base."""
    (tmp_path / "cfg").mkdir()
    base = tmp_path / "cfg" / "base.yaml"
    base.write_text("task: tagging\ndata: {train: a, dev: b}\nmodel: {word_dimm: 3}\ntrain: {batch_size: 2}\n")
    child = _config(tmp_path / "cfg", "base: base.yaml\ntrain: {batch_size: many}\n")
    assert main(["train", child, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert f"model.word_dimm: unknown key (did you mean word_dim?) (set in {base}, line 3)" in err
    assert "train.batch_size: Input should be a valid integer (got 'many') (line 2)\n" in err + "\n"  # its own key
    assert main(["train", child, "--set", "model.word_dimm=4", "--print-config"]) == 2
    assert "model.word_dimm: unknown key (did you mean word_dim?) (from --set)\n" in capsys.readouterr().err + "\n"


def test_a_set_mapping_is_blamed_only_for_the_keys_it_sets(tmp_path, capsys):
    """--set train={lr: 0.5} merges into train: the file's bad key beside it keeps its own line."""
    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\ntrain:\n  lrr: 3\n")
    assert main(["train", path, "--set", "train={lr: 0.5}", "--print-config"]) == 2
    assert "train.lrr: unknown key (did you mean lr?) (line 4)\n" in capsys.readouterr().err + "\n"
    assert main(["train", path, "--set", "train={lr: 0.5, batch_sise: 2}", "--print-config"]) == 2
    assert "train.batch_sise: unknown key (did you mean batch_size?) (from --set)\n" in capsys.readouterr().err + "\n"


def test_config_errors_name_the_line_of_the_key(tmp_path, capsys):
    """Block style, a list item (a part: the schema's location ends in the item, whose line is named), and a
    key nested under a name the schema adds (the part's type tag) found at its enclosing key."""
    from sanlab.config import key_line

    path = _config(tmp_path, "task: translation\ndata:\n  train: {src: a, tgt: b}\n  valid: {src: c, tgt: d}\n"
                             "model:\n  encoder:\n    attention:\n      parts:\n        - type: window\n"
                             "          sizee: 3\n  dimm: 8\n")
    assert main(["train", path, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "model.dimm: unknown key (did you mean dim?) (line 11)" in err
    assert "model.encoder.attention.parts.0: " in err and "sizee" in err and "(line 9)" in err
    # the same key given by --set, whole or in part, is not blamed on the file's line
    for override in ("model.encoder.attention.parts=[{type: window, sizee: 3}]",
                     "model.encoder.attention.parts.0.sizee=4"):
        assert main(["train", path, "--set", override, "--print-config"]) == 2
        err = capsys.readouterr().err
        assert "model.encoder.attention.parts.0: " in err and "(from --set)" in err and "(line 9)" not in err
    assert key_line(Path(path), "model.encoder.attention.parts.0.window.sizee") == 10  # the tag is skipped
    assert key_line(Path(path), "model.nothing") == 5 and key_line(Path(path), "train.lr") is None
    # a key YAML reads as a number (``3:``) is named by its line too
    (tmp_path / "numbered").mkdir()
    numbered = _config(tmp_path / "numbered", "base: ../c.yaml\ntrain:\n  3: 4\n")
    assert main(["train", numbered, "--print-config"]) == 2
    assert "train.3: unknown key (line 3)" in capsys.readouterr().err
    assert key_line(tmp_path / "missing.yaml", "model") is None


def test_ill_typed_override_is_named(tmp_path, capsys):
    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\n")
    assert main(["train", path, "--set", "train.batch_size=many", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "train.batch_size" in err and "many" in err and "--set" in err


def test_print_config_resolves_overrides(tmp_path, capsys):
    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\n")
    assert main(["train", path, "--set", "model.encoder.layers=3", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "layers: 3" in out and "optimizer: rmsprop" in out


def test_a_part_on_a_layer_the_stack_does_not_have_is_a_config_error(tmp_path, capsys):
    path = _config(tmp_path, "task: translation\ndata: {train: {src: a, tgt: b}, valid: {src: a, tgt: b}}\n"
                             "model: {encoder: {layers: 3, attention: {parts: [{type: window, layers: [3, 4]}]}}}\n")
    assert main(["train", path, "--print-config"]) == 2
    assert ("model.encoder: attention.parts[0] (window): layers [3, 4] name no layer of a stack of 3 "
            "layers (indices 0-2)") in capsys.readouterr().err


def test_a_parts_own_rule_is_said_in_its_words(tmp_path, capsys):
    """Without pydantic's "Value error, " before them (it read "size: Value error, window size M must be odd")."""
    path = _config(tmp_path, "task: translation\ndata: {train: {src: a, tgt: b}, valid: {src: a, tgt: b}}\n"
                             "model: {encoder: {attention: {parts: [{type: window, size: 4}]}}}\n")
    assert main(["train", path, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "attention part 'window': size: window size M must be odd" in err and "Value error" not in err, err


@pytest.mark.parametrize("body, expected", [
    ("task: tagging\ndata: {train: a, dev: b\n", r"c\.yaml.*line 3"),       # unclosed flow mapping
    ("- just\n- a list\n", r"c\.yaml.*mapping"),
    ("base: c.yaml\ntask: tagging\n", r"c\.yaml, line 1: base 'c\.yaml' loops back"),
    ("# a comment\nbase: missing.yaml\n", r"c\.yaml, line 2: base 'missing\.yaml': .*missing\.yaml: config file not found"),
    ("base: 3\n", r"c\.yaml, line 1: base must be a file name .* got 3"),
    ("base: ./\n", r"c\.yaml, line 1: base '\./': .* is a directory, not a config file"),
    ("task: tagging\nbase: preset:nope\n", r"c\.yaml, line 2: unknown preset .preset:nope.; known presets"),
    ("task: tagging\ntrain: {lr: 0.5}\ndata: {train: a, dev: b}\ntrain: {seed: 7}\n",
     r"c\.yaml, line 4, column 1: not valid YAML: key 'train' is given twice \(first on line 2\)\n"),  # PyYAML
    # would drop lr silently; and PyYAML's own position lines name "<unicode string>", not the file
    ("task: tagging\ntrain:\n\tmax_steps: 3\n", r"c\.yaml, line 3, column 1: not valid YAML: .*'\\t' that cannot start"),
])
def test_broken_config_files_are_named(tmp_path, capsys, body, expected):
    import re

    path = _config(tmp_path, body)
    assert main(["train", path, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert re.search(expected, err, re.S), err
    assert "Traceback" not in err and "<unicode string>" not in err


def test_a_base_chain_that_loops_names_the_file_and_line_that_closes_it(tmp_path, capsys):
    """The loop was reported at the file visited twice, "a.yaml: 'base' chain loops back to itself", without the
    line or the file whose `base:` leads back to it."""
    (tmp_path / "a.yaml").write_text("task: tagging\nbase: sub/b.yaml\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text("# b\n\nbase: ../a.yaml\n")
    assert main(["train", str(tmp_path / "a.yaml"), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'sub' / 'b.yaml'}, line 3: base '../a.yaml' loops back to {tmp_path / 'a.yaml'}" in err, err


def test_a_rule_between_keys_is_traced_to_the_line_of_the_key_it_names(tmp_path, capsys):
    """A model's own rule (an unread train key, data.max_len against model.max_positions) is reported at its
    section, or at <root>: that was shown with the section's line in the file itself, "train: ... train.betas is
    (0.8, 0.9) ... (line 2)" where line 2 set only the optimizer, or with no line at all."""
    files = "data: {train: {src: a, tgt: b}, valid: {src: a, tgt: b}}\n"
    (tmp_path / "base.yaml").write_text(f"task: translation\n{files}train:\n  lr: 0.001\n  betas: [0.8, 0.9]\n")
    child = _config(tmp_path, "base: base.yaml\ntrain: {optimizer: rmsprop}\n")
    assert main(["train", child, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "train.betas is (0.8, 0.9)" in err and f"(set in {tmp_path / 'base.yaml'}, line 5)" in err, err
    for body, line in [("train:\n  batch_size: 64\n", 4), ("model: {max_positions: 64}\n\n\n\n", 3)]:
        path = _config(tmp_path, f"task: translation\n{files}{body}")
        assert main(["train", path, "--print-config"]) == 2
        err = capsys.readouterr().err
        assert err.rstrip().endswith(f"(line {line})"), err


def test_an_unquoted_boolean_or_number_where_text_belongs_says_to_quote_it(tmp_path, capsys):
    """The loader reads yes, no, on and off as booleans (YAML 1.1's, as PyYAML): `src: on` was refused as "Input
    should be a valid string (got True)", naming a value the file does not spell and not the cure."""
    path = _config(tmp_path, "task: translation\ndata:\n  train: {src: a, tgt: b}\n  valid: {src: on, tgt: b}\n"
                             "  test: {t: {src: 2016, tgt: b}}\n")
    assert main(["train", path, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "data.valid.src: Input should be a valid string (got True): YAML reads an unquoted on, off, yes, no, " \
           "true or false as a boolean: write text in quotes (line 4)" in err, err
    assert "data.test.t.src: Input should be a valid string (got 2016): YAML reads it as a number: write text in " \
           "quotes (line 5)" in err, err


def test_a_whole_number_written_as_a_float_says_to_write_it_whole(tmp_path, capsys):
    """`max_steps: 1e5` is a float in YAML (1.2 and 1.1 alike): refused as an integer key, with the cure, not only
    pydantic's "valid integer (got 100000.0)"; a fraction keeps the plain refusal."""
    path = _config(tmp_path, "task: translation\ndata:\n  train: {src: a, tgt: b}\n  valid: {src: a, tgt: b}\n"
                             "train:\n  max_steps: 1e5\n  max_epochs: 2.5\n")
    assert main(["train", path, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "train.max_steps: Input should be a valid integer (got 100000.0): a number with an exponent or a decimal " \
           "point (1e5, 100000.0) is a float in YAML; write it as a whole number (100000) (line 6)" in err, err
    assert "train.max_epochs: Input should be a valid integer (got 2.5) (line 7)" in err, err


def test_a_part_without_a_type_lists_the_types(tmp_path, capsys):
    path = _config(tmp_path, "task: translation\ndata:\n  train: {src: a, tgt: b}\n  valid: {src: a, tgt: b}\n"
                             "model:\n  encoder:\n    attention:\n      parts: [{size: 3}]\n")
    assert main(["train", path, "--print-config"]) == 2
    assert "an attention part needs a 'type' (one of: abs_position, bi_direct, " in capsys.readouterr().err


def test_a_misspelt_task_is_named_with_its_line_and_the_task_it_is_like(tmp_path, capsys):
    """It was pydantic's "<root>: Input tag 'transltion' found using 'task' does not match any of the expected tags",
    at no line and with no suggestion, where a misspelt key gets both."""
    path = _config(tmp_path, "# recipe\ntask: transltion\ndata: {}\n")
    assert main(["train", path, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "  task: unknown task 'transltion' (known: translation, tagging) (did you mean translation?) (line 2)" \
        in err, err
    assert main(["train", path, "--set", "task=taging", "--print-config"]) == 2
    assert "task: unknown task 'taging'" in (err := capsys.readouterr().err) and "(from --set)" in err, err


def test_a_grid_whose_base_is_missing_names_the_grid_file_and_line(tmp_path):
    """It was "nothere.yaml: config file not found", naming neither the grid nor its `base:` line."""
    from sanlab.errors import ConfigError

    grid = tmp_path / "grid.yaml"
    grid.write_text("title: t\nseeds: [0]\nbase: nothere.yaml\nvariants: [{name: a}]\n")
    with pytest.raises(ConfigError) as err:
        load_grid(grid, runs_dir=tmp_path / "runs")
    assert str(err.value) == f"{grid}, line 3: base 'nothere.yaml': {tmp_path / 'nothere.yaml'}: config file not found"


def test_a_config_that_is_not_utf8_or_is_a_directory_is_named(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_bytes("task: tagging\n# café\n".encode("latin-1"))
    assert main(["train", str(path), "--print-config"]) == 2
    assert "c.yaml, line 2: not valid UTF-8 (byte 0xe9" in capsys.readouterr().err
    assert main(["train", str(tmp_path), "--print-config"]) == 2
    assert f"{tmp_path}: is a directory, not a config file" in capsys.readouterr().err


def test_an_unreadable_config_is_named(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    path = tmp_path / "c.yaml"
    path.write_text("task: tagging\n")
    real = Path.read_text

    def denied(self, *args, **kwargs):  # (the tests run as root, for whom chmod 000 still reads)
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    assert main(["train", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: cannot read this config file: Permission denied" in err and "Traceback" not in err


@pytest.mark.parametrize("setting, key", [
    ("train.batch_size=0", "train.batch_size"), ("train.max_tokens=0", "train.max_tokens"),
    ("train.patience=-1", "train.patience"), ("train.valid_max_sentences=-1", "train.valid_max_sentences"),
    ("train.lr=-0.1", "train.lr"), ("train.warmup_steps=-5", "train.warmup_steps"),
    ("train.label_smoothing=1.0", "train.label_smoothing"), ("data.vocab_max=0", "data.vocab_max"),
    ("model.max_len=0", "model.max_len"), ("model.dropout=1.5", "model.dropout"),
    ("train.lr=.inf", "train.lr"), ("train.lr=nan", "train.lr"),  # non-finite numbers anywhere in a config
    ("model.encoder.attention.heads=0", "model.encoder.attention.heads"),
    ("model.encoder.attention.heads=-4", "model.encoder.attention.heads"),
    ("model.encoder.attention.dropout=1.5", "model.encoder.attention.dropout"),
])
def test_out_of_range_values_are_config_errors_naming_the_key(tmp_path, capsys, setting, key):
    """Caught when the config is read, not as a traceback after data preparation (or read as "all"/"never")."""
    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\n")
    assert main(["train", path, "--set", setting, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err, err


@pytest.mark.parametrize("setting, key", [("data.max_ratio=0.5", "data.max_ratio"),
                                          ("decode.length_penalty=.nan", "decode.length_penalty")])
def test_out_of_range_translation_values_are_config_errors_naming_the_key(tmp_path, capsys, setting, key):
    path = _config(tmp_path, "task: translation\ndata: {train: {src: a, tgt: b}, valid: {src: a, tgt: b}}\n")
    assert main(["train", path, "--set", setting, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err, err


def test_yaml_anchors_and_merge_keys_still_load(tmp_path, capsys):
    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\nx: &base {lr: 0.002}\n"
                             "train: {<<: *base, batch_size: 16}\n")
    from sanlab.config import read_yaml_mapping

    assert read_yaml_mapping(path)["train"] == {"lr": 0.002, "batch_size": 16}


def test_a_missing_config_file_is_named(tmp_path, capsys):
    assert main(["train", str(tmp_path / "none.yaml"), "--print-config"]) == 2
    assert "none.yaml" in capsys.readouterr().err


def test_set_reaches_into_lists_that_are_there(tmp_path, capsys):
    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\n"
                             "model: {encoder: {attention: {parts: [{type: window, size: 5}]}}}\n")
    assert main(["train", path, "--set", "model.encoder.attention.parts.0.size=7", "--print-config"]) == 0
    assert "size: 7" in capsys.readouterr().out
    for key, expected in [("model.encoder.attention.parts.1.size=7", "is a list of 1 item(s); '1' is not an index"),
                          ("model.decoder.attention.parts.0.size=7", "is not set in the file, so it has no item 0"),
                          ("data.train.x=1", "data.train is a value, not a section"),
                          ("=3", "'': an empty key name"), (".train.max_steps=3", "'.train.max_steps': an empty key")]:
        assert main(["train", path, "--set", key, "--print-config"]) == 2
        assert expected in capsys.readouterr().err


def test_set_with_a_bracketed_index_names_the_dotted_spelling(tmp_path, capsys):
    """`parts[0].size=7` made a key "parts[0]" next to the list, refused as "unknown key (did you mean parts?)",
    which does not say how to name the item; the error now gives the dotted key."""
    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\n"
                             "model: {encoder: {attention: {parts: [{type: window, size: 5}]}}}\n")
    assert main(["train", path, "--set", "model.encoder.attention.parts[0].size=7", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "model.encoder.attention.parts is a list" in err and "model.encoder.attention.parts.0.size" in err, err


def test_set_reaches_into_a_section_the_saved_config_writes_as_null(tmp_path, capsys):
    """A run's config.yaml (--print-config) spells an unset optional section out, `cross_attention: null`;
    `--set model.decoder.cross_attention.heads=2` created the section over the recipe but was refused over that
    file ("is a value, not a section"), so the two were not the same config to --set."""
    import yaml

    recipe = ROOT / "configs/multi30k-en-de-transformer.yaml"
    assert main(["train", str(recipe), "--print-config"]) == 0
    saved = _config(tmp_path, capsys.readouterr().out)
    assert "cross_attention: null" in Path(saved).read_text()
    printed = []
    for path in (str(recipe), saved):
        assert main(["train", path, "--set", "model.decoder.cross_attention.heads=2", "--print-config"]) == 0, \
            capsys.readouterr().err
        printed.append(yaml.safe_load(capsys.readouterr().out))
    assert printed[0] == printed[1] and printed[1]["model"]["decoder"]["cross_attention"]["heads"] == 2


def test_numbers_read_as_yaml_1_2_in_files_and_set(tmp_path, capsys):
    """PyYAML's YAML 1.1 reads 0123 as octal (83) and 1:30 as base 60 (90), silently; a seed means 123."""
    import yaml

    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\ntrain: {seed: 0123, lr: 1e-3, max_steps: 010}\n")
    assert main(["train", path, "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)["train"]
    assert (printed["seed"], printed["lr"], printed["max_steps"]) == (123, 0.001, 10)
    assert main(["train", path, "--set", "train.seed=0o17", "--set", "train.max_steps=1_000", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)["train"]
    assert (printed["seed"], printed["max_steps"]) == (15, 1000)
    assert main(["train", path, "--set", "train.seed=1:30", "--print-config"]) == 2  # a string, refused by name
    assert "train.seed" in capsys.readouterr().err


def test_a_mapping_given_to_set_merges_into_its_section(tmp_path, capsys):
    """As a grid's `set:` does (and Hydra): the section's other keys keep the file's values."""
    import yaml

    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\ntrain: {lr: 0.5, warmup_steps: 7}\n")
    assert main(["train", path, "--set", "train={max_steps: 10}", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)["train"]
    assert (printed["lr"], printed["warmup_steps"], printed["max_steps"]) == (0.5, 7, 10)


ROOT = Path(__file__).resolve().parents[1]
TRANSLATION = "task: translation\ndata:\n  train: {src: a, tgt: b}\n  valid: {src: a, tgt: b}\n"


def test_an_empty_mapping_given_to_set_empties_its_section():
    """`{}` replaced nothing (a recipe's test sets could not be dropped, and `null` is refused); a mapping given
    after it is the whole section."""
    from sanlab.config import load_config

    recipe = ROOT / "configs/multi30k-en-de-transformer.yaml"
    assert list(load_config(recipe).data.test) == ["test_2016_flickr"]
    assert load_config(recipe, ["data.test={}"]).data.test == {}
    mine = load_config(recipe, ["data.test={}", "data.test={mine: {src: m.en, tgt: m.de}}"]).data.test
    assert list(mine) == ["mine"] and mine["mine"].src == "m.en"
    assert list(load_config(recipe, ["data.test={mine: {src: m.en, tgt: m.de}}"]).data.test) == \
        ["test_2016_flickr", "mine"]  # without `{}` first, a mapping still merges


TRICKY = ["1e5", "0o17", "1e3", "yes", "no", "null", "~", "1:30", ".inf", "0x1F", "1_000", "+1", "-.5", "",
          "0123", "1_", "5.", ".NaN", "-0x10", "2016-01-01", "on", "True", "<<", "=", "a: b", "#x", "- a"]


@pytest.mark.parametrize("text", TRICKY)
def test_the_saved_config_reads_back_as_it_was(tmp_path, text):
    """dump_config quoted strings by PyYAML's YAML 1.1 rules, so `1e5` or `0o17` (numbers to this loader) were
    written bare, and a run's config.yaml failed to load on resume; as a file name and a test set's name."""
    import yaml

    from sanlab.config import dump_config, load_config, validate

    raw = yaml.safe_load(TRANSLATION)
    raw["data"]["valid"] = {"src": text, "tgt": text}
    raw["data"]["test"] = {text: {"src": text, "tgt": "t"}}
    config = validate(raw, source="t")
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(config))
    assert load_config(saved).model_dump() == config.model_dump()
    assert yaml.safe_load(saved.read_text()) == config.model_dump(mode="json")  # and by PyYAML's own rules


def _safe_load(text: str):
    """yaml.safe_load's rules over libyaml's parser where PyYAML has it (the grids' cells dump hundreds of configs)."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@pytest.mark.parametrize("recipe", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").glob("**/*.yaml")
                                           if "compare" not in p.parts))
def test_a_recipe_s_printed_config_is_the_same_run(tmp_path, capsys, recipe):
    """--print-config (the run's config.yaml) read back is the recipe's config, and a run started from the recipe
    resumes from it without a differing key (what prepare_run_dir compares)."""
    from sanlab.config import dump_config, load_config
    from sanlab.runs.resume import config_differences, load_run_config

    config = load_config(ROOT / recipe)
    assert main(["train", str(ROOT / recipe), "--print-config"]) == 0
    (tmp_path / "config.yaml").write_text(capsys.readouterr().out)
    assert load_config(tmp_path / "config.yaml") == config
    saved = _safe_load(dump_config(load_run_config(tmp_path)))
    assert config_differences(saved, _safe_load(dump_config(config))) == []


# Cells that differ from an earlier cell of their grid only in train.seed (the same config through the same
# dump and load) are checked in the slow suite only: the fast case reads back every (dataset, variant) of
# every grid, the first of its seeds.
@pytest.mark.parametrize("seeds", ["first-seed", pytest.param("every-seed", marks=pytest.mark.slow)])
@pytest.mark.parametrize("grid", sorted(p.name for p in (ROOT / "configs" / "compare").glob("*.yaml")))
def test_a_grid_cell_s_saved_config_is_the_same_run(tmp_path, grid, seeds):
    """Each cell's config.yaml (dump_config of its config) reads back as that config, so that the cell resumes."""
    from sanlab.config import dump_config, load_config
    from sanlab.runs.resume import config_differences, load_run_config

    cells, seen = [], set()
    for cell in load_grid(ROOT / "configs" / "compare" / grid, runs_dir=tmp_path / "runs").cells:
        if seeds == "every-seed" or (cell.dataset, cell.variant) not in seen:
            cells.append(cell)
            seen.add((cell.dataset, cell.variant))
    for cell in cells:
        (tmp_path / "config.yaml").write_text(dump_config(cell.config))
        assert load_config(tmp_path / "config.yaml") == cell.config, (cell.variant, cell.seed)
        saved = _safe_load(dump_config(load_run_config(tmp_path)))
        assert config_differences(saved, _safe_load(dump_config(cell.config))) == [], (cell.variant, cell.seed)


def test_a_mapping_of_another_type_given_to_set_replaces_the_component():
    """Merging kept the old type's own keys, which the new type refused (a muse mixer's kernel_sizes under
    muse_ff, a window part's size under neighbor); a mapping of the same type, or none, still merges."""
    from sanlab.config import load_config

    muse = ROOT / "configs/paper/iwslt14-de-en-muse.yaml"
    mixer = load_config(muse, ["model.encoder.mixer={type: muse_ff}"]).model.encoder.mixer
    assert mixer.type == "muse_ff" and mixer.input_dropout == 0.0 and not hasattr(mixer, "kernel_sizes")
    kept = load_config(muse, ["model.encoder.mixer={type: muse, weight_dropout: 0.2}"]).model.encoder.mixer
    assert (kept.kernel_sizes, kept.weight_dropout) == ([3, 15], 0.2)
    part = load_config(ROOT / "configs/multi30k-en-de-csan1d.yaml",
                       ["model.encoder.attention.parts.0={type: neighbor}"]).model.encoder.attention.parts[0]
    assert part.type == "neighbor" and part.layers == [0, 1, 2]  # the neighbor's own default, not the window's


def test_setting_only_a_components_type_says_the_old_types_keys_stayed_and_how_to_replace_it():
    """`--set ...parts.0.type=capsule` over a window part keeps the window's size, which capsule refuses: the error
    says why (the old type's keys stayed) and gives the entry to pass whole; a new type the old keys fit is fine."""
    from sanlab.config import load_config
    from sanlab.errors import ConfigError

    csan = ROOT / "configs/multi30k-en-de-csan1d.yaml"
    with pytest.raises(ConfigError) as err:
        load_config(csan, ["model.encoder.attention.parts.0.type=capsule"])
    assert "size: Extra inputs are not permitted" in str(err.value)
    assert ("note: --set model.encoder.attention.parts.0.type=capsule changed the type of "
            "model.encoder.attention.parts.0 ('window') and kept its other keys (size); to replace the entry, give it "
            "whole: --set 'model.encoder.attention.parts.0={type: capsule, layers: [0, 1]}'") in str(err.value)
    given = load_config(csan, ["model.encoder.attention.parts.0={type: capsule, layers: [0, 1]}"])
    assert given.model.encoder.attention.parts[0].layers == [0, 1]
    with pytest.raises(ConfigError) as err:  # another mistake, no retyping: no note
        load_config(csan, ["model.encoder.attention.parts.0.size=x"])
    assert "note:" not in str(err.value)


def test_a_file_over_its_base_replaces_a_component_of_another_type(tmp_path):
    """The base: chain merges with the same function as --set: a child switching a mixer's type replaces it; a
    `{}` in a file adds nothing, as it always did (`model: {encoder: {}}` over a preset keeps the preset's)."""
    from sanlab.config import load_config

    (tmp_path / "base.yaml").write_text(TRANSLATION + "  test: {t1: {src: a, tgt: b}}\nmodel:\n  encoder:\n"
                                        "    mixer: {type: muse, kernel_sizes: [3], weight_dropout: 0.2}\n")
    child = _config(tmp_path, "base: base.yaml\ndata: {test: {}}\nmodel: {encoder: {mixer: {type: muse_ff}}}\n")
    config = load_config(child)
    assert config.model.encoder.mixer.type == "muse_ff" and list(config.data.test) == ["t1"]
    same = _config(tmp_path, "base: base.yaml\nmodel: {encoder: {mixer: {type: muse, weight_dropout: 0.3}}}\n")
    mixer = load_config(same).model.encoder.mixer
    assert (mixer.kernel_sizes, mixer.weight_dropout) == ([3], 0.3)
    # --set empties with `{}` at any depth of the mapping it gives
    assert load_config(child, ["data={test: {}}"]).data.test == {}


def test_a_key_that_reads_as_a_number_is_kept_as_written(tmp_path):
    """A test set `2016:` was named "2016" but --set data.test.2016 did not find it, and `0x10:` became "16";
    a key is a name, kept as the file spells it."""
    from sanlab.config import load_config

    path = _config(tmp_path, TRANSLATION + "  test:\n    2016: {src: t.en, tgt: t.de}\n    0x10: {src: h, tgt: h}\n")
    assert list(load_config(path).data.test) == ["2016", "0x10"]
    changed = load_config(path, ["data.test.2016.src=other.en"]).data.test["2016"]
    assert (changed.src, changed.tgt) == ("other.en", "t.de")


@pytest.mark.parametrize("body, expected", [
    ("    no: {src: a, tgt: b}\n", "data.test: a key YAML reads as the boolean false"),
    ("    ~: {src: a, tgt: b}\n", "data.test: a key YAML reads as null"),
    ("    2016-01-01: {src: a, tgt: b}\n", "data.test: the key 2016-01-01 is a date in YAML, not a name"),
    ("    t: {src: 2016-01-01, tgt: b}\n", "data.test.t.src: YAML reads this value as a date (2016-01-01)"),
    ("    t: {src: 2001-12-14t21:59:43Z, tgt: b}\n", "data.test.t.src: YAML reads this value as a timestamp"),
    ("    t: {src: !!binary aGk=, tgt: b}\n", "data.test.t.src: YAML reads this value as binary data")],
    ids=["bool-key", "null-key", "date-key", "date-value", "timestamp-value", "binary-value"])
def test_a_key_or_value_yaml_reads_as_no_name_is_refused_with_its_line(tmp_path, body, expected):
    """Validating through JSON renamed such keys (`no:` became the test set "false", `~:` "null"), respelled a
    timestamp, and a date key was a TypeError traceback."""
    from sanlab.config import load_config
    from sanlab.errors import ConfigError

    path = _config(tmp_path, TRANSLATION + "  test:\n    first: {src: a, tgt: b}\n" + body)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert expected in str(err.value) and "in quotes" in str(err.value) and str(err.value).endswith("(line 7)")
    with pytest.raises(ConfigError, match=r"data.test: a key YAML reads as the boolean true.*\(from --set\)"):
        load_config(_config(tmp_path, TRANSLATION), ["data.test={yes: {src: a, tgt: b}}"])


def test_set_below_a_section_that_is_not_there_says_it_may_be_a_mapping(tmp_path, capsys):
    """It said "set the whole list instead" for a mapping (data.test) too."""
    path = _config(tmp_path, TRANSLATION)
    assert main(["train", path, "--set", "data.test.2016.src=a", "--print-config"]) == 2
    assert ("data.test is not set in the file, so it has no item 2016: give the whole section (data.test=[...] "
            "for a list, data.test={'2016': ...} for a mapping)") in capsys.readouterr().err


def test_error_paths_are_the_configs_keys(tmp_path):
    """Not pydantic's union tags (data.train.ParallelFiles.src, data.train.list[WeightedFiles].1.tgt), and a key
    named like a task (a test set `translation`) is kept; a union branch that refused the value whole is left out
    when the other branch names what is wrong inside it."""
    from sanlab.config import load_config
    from sanlab.errors import ConfigError

    def problems(body: str, overrides=()) -> str:
        with pytest.raises(ConfigError) as err:
            load_config(_config(tmp_path, body), list(overrides))
        return str(err.value).split("\n", 1)[1]

    assert problems(TRANSLATION + "  test: {translation: {src: a}}\n") == "  data.test.translation.tgt: Field required"
    listed = problems(TRANSLATION.replace("train: {src: a, tgt: b}", "train: [{src: a, tgt: b}, {src: a, tgt: 3}]"))
    assert listed == ("  data.train.1.tgt: Input should be a valid string (got 3): YAML reads it as a number: write "
                      "text in quotes (line 3)")
    assert problems(TRANSLATION.replace("src: a, tgt: b}\n  valid", "src: on, tgt: b}\n  valid")) == \
        ("  data.train.src: Input should be a valid string (got True): YAML reads an unquoted on, off, yes, no, true "
         "or false as a boolean: write text in quotes (line 3)")
    part = problems(TRANSLATION, ["model.encoder.attention.parts=[{type: neighbor, sigma_init: 0}]"])
    assert "attention part 'neighbor': sigma_init: Input should be greater than 0; sigma_init: Input should be " \
           "'rand'" in part and "constrained-float" not in part and "literal" not in part


def test_an_unknown_key_names_the_known_ones_spelt_like_it(tmp_path):
    from sanlab.config import load_config
    from sanlab.errors import ConfigError

    path = _config(tmp_path, TRANSLATION + "train: {lrr: 0.1}\nmodel: {encoder: {attention: {parts: [{type: window, "
                                           "sise: 3}]}}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["train.zzqqxx=1", "trian.lr=2"])
    message = str(err.value)
    assert "  train.lrr: unknown key (did you mean lr?) (line 5)" in message
    assert "  trian: unknown key (did you mean train?) (from --set)" in message
    assert "  train.zzqqxx: unknown key (from --set)" in message  # nothing like it: no guess
    assert "attention part 'window': sise: Extra inputs are not permitted (did you mean size?)" in message


def test_unknown_attention_part_lists_known_ones(tmp_path, capsys):
    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\n"
                             "model: {encoder: {attention: {parts: [{type: nope}]}}}\n")
    assert main(["train", path, "--print-config"]) == 2
    assert "unknown attention part type 'nope'" in capsys.readouterr().err


def test_impossible_combination_is_a_config_error_before_any_data_is_read(tmp_path, capsys):
    path = _config(tmp_path, "task: tagging\ndata: {train: absent.conllu, dev: absent.conllu}\n"
                             "model: {encoder: {attention: {heads: 4, parts: [{type: csan2d, heads_area: 5}]}}}\n")
    assert main(["train", path, "--run", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sanlab train: error: {path}: this model cannot be built:") and "absent" not in err


@pytest.mark.parametrize("side,key", [("encoder", "cross_attention: {heads: 2}"),
                                      ("decoder", "pre_blocks: [{type: conv}]")])
def test_a_key_of_the_other_side_of_the_model_is_refused_not_ignored(tmp_path, capsys, side, key):
    """Both stacks share one schema, so the encoder has a cross_attention key and the decoder pre_blocks:
    setting either is an error before any data is read, never a setting that silently does nothing."""
    path = _config(tmp_path, "task: translation\ndata: {train: {src: a, tgt: b}, valid: {src: a, tgt: b}}\n"
                             f"model: {{dim: 16, {side}: {{layers: 1, attention: {{heads: 2}}, {key}}}}}\n")
    assert main(["train", path, "--run", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: this model cannot be built:" in err and key.split(":")[0] in err, err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("part, message", [
    # local_soft counts the keys for L(i) and averages them; 2D-CSAN repeats them per head of its area
    ("local_soft", "LocalSoft measure the sentence from the keys, which HeadArea repeats"),
    # capsule routing reads the scores as a grid of positions, one key column each
    ("capsule", "CapsuleRouting need one key column per position, which HeadArea extends"),
])
def test_parts_that_cannot_share_a_layer_with_2d_csan_are_refused_before_training(tmp_path, capsys, part, message):
    path = _config(tmp_path, "task: translation\ndata: {train: {src: a, tgt: b}, valid: {src: a, tgt: b}}\n"
                             "model: {encoder: {attention: {heads: 4, parts: [{type: csan2d, layers: [0]}, "
                             f"{{type: {part}, layers: [0]}}]}}}}}}\n")
    assert main(["train", path, "--run", str(tmp_path / "r"), "--quiet"]) == 2
    assert message in capsys.readouterr().err


def test_mismatched_parallel_files_name_the_files(tmp_path, capsys):
    (tmp_path / "a.src").write_text("one\ntwo\nthree\n")
    (tmp_path / "a.tgt").write_text("eins\nzwei\n")
    path = _config(tmp_path, f"task: translation\ndata: {{train: {{src: {tmp_path}/a.src, tgt: {tmp_path}/a.tgt}}, "
                             f"valid: {{src: {tmp_path}/a.src, tgt: {tmp_path}/a.tgt}}}}\n")
    assert main(["train", path, "--run", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "a.src" in err and "a.tgt" in err and "3 lines" in err and "2" in err.split("3 lines", 1)[1]


def test_empty_file_is_named(tmp_path, capsys):
    (tmp_path / "e.src").write_text("")
    (tmp_path / "e.tgt").write_text("")
    path = _config(tmp_path, f"task: translation\ndata: {{train: {{src: {tmp_path}/e.src, tgt: {tmp_path}/e.tgt}}, "
                             f"valid: {{src: {tmp_path}/e.src, tgt: {tmp_path}/e.tgt}}}}\n")
    assert main(["train", path, "--run", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "e.src" in err and "empty" in err


def test_malformed_conllu_line_is_named(tmp_path, capsys):
    good = "1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n2\tdog\tdog\tNOUN\tNN\t_\t0\troot\t_\t_\n\n"
    (tmp_path / "bad.conllu").write_text(good + "1\tA\ta\tDET\n\n")
    path = _config(tmp_path, f"task: tagging\ndata: {{train: {tmp_path}/bad.conllu, dev: {tmp_path}/bad.conllu}}\n")
    assert main(["train", path, "--run", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bad.conllu:4" in err


def test_compare_dry_run_lists_cells(capsys):
    grid = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "configs/compare/dufter-table2-ud.yaml")
    assert main(["compare", grid, "--dry-run", "--runs-dir", "/nonexistent/sanlab-dry-run"]) == 0
    out = capsys.readouterr().out
    assert "SAN+PE[add]" in out and "pending" in out


def test_compare_seed_option_narrows_the_cells(capsys):
    grid = str(Path(__file__).resolve().parents[1] / "configs/compare/csan-table1-multi30k.yaml")
    assert main(["compare", grid, "--dry-run", "--runs-dir", "/nonexistent/sanlab-dry-run", "--seed", "3"]) == 0
    listed = [line.split("  ")[0] for line in capsys.readouterr().out.splitlines()]
    planned = load_grid(grid)
    with_seed_3 = [f"{c.variant} / seed 3" for c in planned.cells if c.seed == 3]
    assert "vanilla / seed 3" in with_seed_3 and len(with_seed_3) < len(planned.spec.variants)
    assert listed == with_seed_3 + [f"0 of {len(with_seed_3)} cells evaluated"]


def test_params_refuses_a_set_without_config_and_an_unknown_preset(capsys):
    assert main(["params", "--set", "model.dim=8"]) == 2
    assert "--set changes a CONFIG" in capsys.readouterr().err
    assert main(["params", "--preset", "nosuch"]) == 2
    captured = capsys.readouterr()
    assert "--preset 'nosuch': the table of every variant is built over transformer_base or transformer_big" \
        in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("preset", ["muse_iwslt", "dynamic_conv_iwslt"])
def test_params_refuses_a_preset_with_a_mixer_of_its_own(preset, capsys):
    """A preset whose own mixer the variants' keys go over (six kernel widths in a 12-layer MUSE stack) was a
    traceback; only the plain Transformers the docs name are offered."""
    assert main(["params", "--preset", preset]) == 2
    captured = capsys.readouterr()
    assert f"--preset '{preset}': the table of every variant is built over" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_params_refuses_a_preset_with_a_config(capsys):
    """--preset with CONFIG was silently ignored: the CONFIG is counted with its own model."""
    recipe = str(Path(__file__).resolve().parents[1] / "configs/paper/iwslt14-de-en-muse.yaml")
    assert main(["params", recipe, "--preset", "transformer_big"]) == 2
    captured = capsys.readouterr()
    assert "--preset chooses the model of the table of every variant" in captured.err and captured.out == ""


@pytest.mark.parametrize("command", ["train", "compare"])
def test_a_bad_device_is_named_as_the_option_given(tmp_path, capsys, command):
    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\n")
    argv = ["train", path, "--print-config"] if command == "train" else \
        ["compare", str(Path(__file__).resolve().parents[1] / "configs/compare/smoke-synthetic.yaml"), "--dry-run"]
    assert main([*argv, "--device", "gpu"]) == 2
    err = capsys.readouterr().err
    assert "--device 'gpu': expected auto, cpu, cuda or cuda:N" in err and "--set" not in err


def test_an_os_error_while_writing_is_one_line_naming_the_file(monkeypatch, capsys):
    import sanlab.cli as cli

    def full(args):
        raise OSError(28, "No space left on device", "/some/out.txt")

    monkeypatch.setattr(cli, "_cmd_env", full)
    assert main(["env"]) == 1
    assert capsys.readouterr().err == "sanlab env: error: /some/out.txt: No space left on device\n"


def test_an_empty_section_is_named_as_such(tmp_path, capsys):
    path = _config(tmp_path, "task: tagging\ndata: {train: a, dev: b}\ntrain:\n  # max_steps: 3\n")
    assert main(["train", path, "--print-config"]) == 2
    assert "train: an empty section (every key under it commented out?)" in capsys.readouterr().err


def test_a_section_set_to_null_on_the_command_line_is_not_told_to_remove_a_line(tmp_path, capsys):
    """`--set data.test=null` (to drop a recipe's test sets) got the file's advice, "... or remove the line"."""
    path = _config(tmp_path, TRANSLATION + "  test: {t: {src: a, tgt: b}}\n")
    assert main(["train", path, "--set", "data.test=null", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "data.test: null where a section belongs: give it keys, or {} to empty it (from --set)" in err, err


@pytest.mark.parametrize("edges, problem", [("10,5", "strictly increasing, got [10, 5]"), ("0,5", "edges >= 1"),
                                            ("10,a", "got '10,a'")])
def test_length_bucket_edges_are_checked_before_any_run_loads(edges, problem, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", "length-buckets", "no-such-run", "--buckets", edges])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --buckets" in err and problem in err and "no-such-run" not in err


def test_a_dotted_key_inside_a_set_mapping_is_a_path():
    """`--set model={encoder.layers: 2}` sets model.encoder.layers (docs/compare.md: dotted keys allowed), at any
    depth of the mapping, as a grid's set: and overrides: do."""
    from sanlab.config import load_config

    recipe = ROOT / "configs" / "multi30k-en-de-transformer.yaml"
    config = load_config(recipe, ["model={encoder.layers: 2, decoder: {attention.heads: 2}}"])
    assert (config.model.encoder.layers, config.model.decoder.attention.heads) == (2, 2)
    assert config.model.dim == load_config(recipe).model.dim   # merged: the rest of model kept


def test_a_device_may_be_both_input_and_output():
    from sanlab.files import check_output_file

    check_output_file("/dev/null", inputs=("/dev/null",))   # written in place, never replaced: nothing is lost


def _library_logs(monkeypatch, *records):
    """``sanlab env`` logs ``records`` ((logger, level, message)) under the library's loggers, and exits 0."""
    import logging

    import sanlab.cli

    def logs(args):
        for name, level, message in records:
            logging.getLogger(name).log(level, message)
        return 0
    monkeypatch.setattr(sanlab.cli, "_cmd_env", logs)


@pytest.fixture
def callers_logging():
    """Adds a caller's handler to a logger (the root by default), as logging.basicConfig would; removed after."""
    import logging

    added = []

    def add(handler, logger=""):
        logging.getLogger(logger).addHandler(handler)
        added.append((logger, handler))
        return handler
    yield add
    for logger, handler in added:
        logging.getLogger(logger).removeHandler(handler)


class _Collects(logging.Handler):
    """A caller's handler that writes nowhere near stderr (a file log, caplog): what it was handed."""

    def __init__(self, level=0):
        super().__init__(level)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelname, record.name, record.getMessage()))


def test_a_library_warning_under_a_callers_logging_on_stderr_is_printed_once_by_it(monkeypatch, capsys,
                                                                                    callers_logging):
    """A caller with logging on stderr (logging.basicConfig) gets the library's warnings through its own handler, in
    its own format, while main() runs, and the CLI does not print them a second time (it did, once, as "WARNING:
    ..."; later it stopped propagation, and the caller's handlers lost them)."""
    import logging

    _library_logs(monkeypatch, ("sanlab.runs.trained", logging.WARNING, "the average is stale"))
    callers = callers_logging(logging.StreamHandler(sys.stderr))  # the sys.stderr capsys set up
    callers.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
    assert main(["env"]) == 0
    assert capsys.readouterr().err == "WARNING:sanlab.runs.trained:the average is stale\n"
    library = logging.getLogger("sanlab")
    assert library.propagate and not library.handlers  # as before the command
    logging.getLogger("sanlab.runs.trained").warning("outside a command")
    assert capsys.readouterr().err == "WARNING:sanlab.runs.trained:outside a command\n"


def test_library_records_reach_a_callers_logging_during_a_command(monkeypatch, capsys, callers_logging):
    """A Python caller's root handlers (a file log, caplog) get every record of the library while main() runs, the
    warnings included; a handler that does not write to stderr does not show them to the user, so the CLI prints
    them too, once."""
    import logging

    _library_logs(monkeypatch, ("sanlab.data.parallel", logging.INFO, "skipped 2 pairs with an empty side"),
                  ("sanlab.runs.trained", logging.WARNING, "the average is stale"))
    callers = callers_logging(_Collects(logging.DEBUG))
    library = logging.getLogger("sanlab")
    level = library.level
    library.setLevel(logging.INFO)  # as a caller's configuration would (the root's default WARNING otherwise)
    try:
        assert main(["env"]) == 0
    finally:
        library.setLevel(level)
    assert callers.records == [("INFO", "sanlab.data.parallel", "skipped 2 pairs with an empty side"),
                               ("WARNING", "sanlab.runs.trained", "the average is stale")]
    assert capsys.readouterr().err == "WARNING: the average is stale\n"   # once, by the CLI
    assert library.propagate and not library.handlers  # as before the command


def test_the_cli_prints_the_warnings_a_callers_stderr_handler_would_not(monkeypatch, capsys, callers_logging):
    """Whether the caller's handler on stderr shows a record is its level's say, record by record:
    a handler for errors only leaves the warning to the CLI, and shows the error itself (once)."""
    import logging

    _library_logs(monkeypatch, ("sanlab.runs.trained", logging.WARNING, "the average is stale"),
                  ("sanlab.runs.trained", logging.ERROR, "the run is gone"))
    callers = callers_logging(logging.StreamHandler(sys.stderr))
    callers.setFormatter(logging.Formatter("caller %(levelname)s %(message)s"))
    callers.setLevel(logging.ERROR)
    assert main(["env"]) == 0
    assert capsys.readouterr().err == "WARNING: the average is stale\ncaller ERROR the run is gone\n"


class _OnlyOnce(logging.Filter):
    """A caller's stateful filter (a common "log once"): passes each message the first time it is asked, only."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def filter(self, record):
        first = record.getMessage() not in self.seen
        self.seen.add(record.getMessage())
        return first


def test_a_callers_stderr_handler_with_filters_is_never_asked_and_the_cli_prints_the_warning(monkeypatch, capsys,
                                                                                             callers_logging):
    """Asking a caller's handler whether it would show a record runs its filters, and a stateful one ("log once")
    spent its one pass on the question: the CLI left the warning to the handler, which then refused it, and the
    warning was lost. A handler with filters is not known to show a record: the CLI prints it (a possible duplicate
    beats a loss), and the caller's filter sees the record once, when its handler is handed it."""
    import logging

    _library_logs(monkeypatch, ("sanlab.runs.trained", logging.WARNING, "the average is stale"))
    callers = callers_logging(logging.StreamHandler(sys.stderr))
    callers.setFormatter(logging.Formatter("caller: %(message)s"))
    once = _OnlyOnce()
    callers.addFilter(once)
    assert main(["env"]) == 0
    assert capsys.readouterr().err == "WARNING: the average is stale\ncaller: the average is stale\n"
    assert main(["env"]) == 0  # the caller's filter now refuses it; the CLI still shows it
    assert capsys.readouterr().err == "WARNING: the average is stale\n"


def test_a_callers_stderr_handler_anywhere_on_the_records_way_counts(monkeypatch, capsys, callers_logging):
    """A caller's stderr handler on a sanlab logger (here ``sanlab.runs``) shows the warning: not printed again; with
    the caller's own ``propagate=False`` on ``sanlab``, the root's stderr handler never sees it: printed by the CLI
    (and the caller's choice is kept)."""
    import logging

    _library_logs(monkeypatch, ("sanlab.runs.trained", logging.WARNING, "the average is stale"))
    runs = callers_logging(logging.StreamHandler(sys.stderr), "sanlab.runs")
    runs.setFormatter(logging.Formatter("runs: %(message)s"))
    assert main(["env"]) == 0
    assert capsys.readouterr().err == "runs: the average is stale\n"

    logging.getLogger("sanlab.runs").removeHandler(runs)
    root = callers_logging(logging.StreamHandler(sys.stderr))
    root.setFormatter(logging.Formatter("root: %(message)s"))
    library = logging.getLogger("sanlab")
    library.propagate = False
    try:
        assert main(["env"]) == 0
        assert not library.propagate
    finally:
        library.propagate = True
    assert capsys.readouterr().err == "WARNING: the average is stale\n"


def test_a_callers_handler_on_stderrs_descriptor_counts_as_stderr(monkeypatch, tmp_path, callers_logging):
    """A handler made on another file object of stderr's descriptor (``sys.__stderr__`` while ``sys.stderr`` wraps
    descriptor 2) writes where the CLI would: the warning is written once; one on stdout's does not count."""
    import logging

    _library_logs(monkeypatch, ("sanlab.runs.trained", logging.WARNING, "the average is stale"))
    err = tmp_path / "err"
    with open(err, "w") as stderr, open(stderr.fileno(), "w", closefd=False) as same, open(tmp_path / "out", "w") as out:
        monkeypatch.setattr(sys, "stderr", stderr)
        callers = callers_logging(logging.StreamHandler(same))
        callers.setFormatter(logging.Formatter("caller: %(message)s"))
        assert main(["env"]) == 0
        same.flush()
        callers.setStream(out)  # another descriptor: the CLI prints it as well
        assert main(["env"]) == 0
        monkeypatch.undo()
    assert err.read_text() == "caller: the average is stale\nWARNING: the average is stale\n"
    assert (tmp_path / "out").read_text() == "caller: the average is stale\n"
