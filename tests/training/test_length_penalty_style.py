"""``decode.length_penalty_style``: fairseq's ``L ** alpha`` (the default: every earlier run, recipe and result)
or GNMT's ``((5 + L) / 6) ** alpha`` (Vaswani et al., THUMT, OpenNMT-py), from the config to the search, on
copies of the committed tiny runs (tests/fixtures/rundir-v1, the ``legacy`` fixture), whose saved configs predate
the key."""

import json
from pathlib import Path
from typing import get_args

import pytest

from sanlab.cli import main
from sanlab.config import DecodeConfig, load_config
from sanlab.errors import ConfigError
from sanlab.runs import evaluate_run, load_trained, prepare_run_dir

ROOT = Path(__file__).resolve().parents[2]
RUN = Path("translation")  # in the legacy fixture's copy: beam 2, length_penalty 1.0, no length_penalty_style


def _sources() -> list[str]:
    return Path("data/translation/test.src").read_text(encoding="utf-8").splitlines()


def _penalty(style: str, alpha: float, length: int) -> float:
    """The documented rule, written out: ``length`` counts the end of sentence."""
    return length ** alpha if style == "fairseq" else ((5 + length) / 6) ** alpha


def test_the_cli_config_and_search_offer_the_same_styles():
    from sanlab import cli
    from sanlab.decoding import search

    assert get_args(DecodeConfig.model_fields["length_penalty_style"].annotation) == cli.LENGTH_PENALTY_STYLES \
        == search.LENGTH_PENALTY_STYLES == ("fairseq", "gnmt")
    assert DecodeConfig().length_penalty_style == "fairseq"


def test_a_run_saved_without_the_key_decodes_as_it_did(legacy):
    """The old config reads as fairseq's form, and evaluating again writes the committed hypotheses byte for byte."""
    saved = (RUN / "config.yaml").read_text(encoding="utf-8")
    assert "length_penalty_style" not in saved
    assert load_config(RUN / "config.yaml").decode.length_penalty_style == "fairseq"
    committed = (RUN / "hyp-best-test.txt").read_bytes()
    record = evaluate_run(RUN, checkpoint="best")["test"]
    assert (RUN / "hyp-best-test.txt").read_bytes() == committed
    assert record["decode"]["length_penalty_style"] == "fairseq"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])  # bf16: the fp32 rescoring ranks by the style too
def test_set_gnmt_reaches_the_search(legacy, precision):
    """The same model and beam: each hypothesis is scored with the style the config names, and GNMT's form picks
    other translations than fairseq's for this model (8 of its 10 test sentences)."""
    from sanlab.tasks.translation import search_translations
    from sanlab.training.device import decoding_precision

    _, model, spm = load_trained(RUN, device="cpu")
    found = {}
    for style in ("fairseq", "gnmt"):
        config = load_config(RUN / "config.yaml", [f"decode.length_penalty_style={style}"])
        decode = config.decode
        assert (decode.length_penalty_style, decode.beam, decode.length_penalty) == (style, 2, 1.0)
        nbest = search_translations(model, spm, _sources(), decode=decode, n_best=2,
                                    precision=decoding_precision(precision, "cpu"))
        for hyps in nbest:
            assert [h.score for h in hyps] == pytest.approx(
                [h.log_prob / _penalty(style, decode.length_penalty, len(h.tokens) + 1) for h in hyps], rel=1e-6)
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        found[style] = [spm.tgt.decode(hyps[0].tokens) for hyps in nbest]
    if precision == "fp32":
        assert "\n".join(found["fairseq"]) + "\n" == (RUN / "hyp-best-test.txt").read_text(encoding="utf-8")
    assert sum(a != b for a, b in zip(found["fairseq"], found["gnmt"])) >= 1


def test_a_run_resumed_with_gnmt_evaluates_with_it(legacy, tmp_path, capsys):
    """`train --set decode.length_penalty_style=gnmt` on a run may go on (a decoding key); the saved config then
    says gnmt, `evaluate` decodes so and records it, and scripts/decode_agreement.py's report says so."""
    import importlib.util

    committed = (RUN / "hyp-best-test.txt").read_text(encoding="utf-8")
    # what `train` does first: the run's saved config against the new one, rewritten where a resumable key changed
    assert prepare_run_dir(RUN, load_config(RUN / "config.yaml", ["decode.length_penalty_style=gnmt"]),
                           overwrite=False)
    assert load_config(RUN / "config.yaml").decode.length_penalty_style == "gnmt"
    record = evaluate_run(RUN, checkpoint="best")["test"]
    assert record["decode"]["length_penalty_style"] == "gnmt"
    assert (RUN / "hyp-best-test.txt").read_text(encoding="utf-8") != committed
    spec = importlib.util.spec_from_file_location("decode_agreement", ROOT / "scripts" / "decode_agreement.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--run", str(RUN), "--device", "cpu", "--output", str(tmp_path / "agreement.md")]) == 0
    assert "- Decoding: beam 2, length penalty 1.0 in GNMT's form, max length 1.2 x source + 3" in \
        capsys.readouterr().out


def test_translate_takes_the_style_for_one_call(legacy, tmp_path, capsys):
    from sanlab.tasks.translation import translate

    out = tmp_path / "gnmt.txt"
    common = ["translate", "--run", str(RUN), "--device", "cpu", "--input", "data/translation/test.src"]
    assert main([*common, "--length-penalty-style", "gnmt", "--output", str(out)]) == 0
    config, model, spm = load_trained(RUN, device="cpu")
    expected = translate(model, spm, _sources(), decode=config.decode.updated(length_penalty_style="gnmt"))
    assert out.read_text(encoding="utf-8") == "".join(h + "\n" for h in expected)
    assert out.read_text(encoding="utf-8") != (RUN / "hyp-best-test.txt").read_text(encoding="utf-8")
    with pytest.raises(SystemExit):  # argparse: not a choice
        main([*common, "--length-penalty-style", "wu"])
    assert "invalid choice: 'wu' (choose from 'fairseq', 'gnmt')" in capsys.readouterr().err


def test_a_bad_style_is_a_config_error_naming_its_line_and_the_styles(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(f"base: {ROOT / 'configs' / 'multi30k-en-de-transformer.yaml'}\ndecode:\n  beam: 4\n"
                    "  length_penalty_style: wu\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    header, problem = str(err.value).splitlines()
    assert header == f"{path}: invalid config"
    assert problem == "  decode.length_penalty_style: Input should be 'fairseq' or 'gnmt' (got 'wu') (line 4)"
    with pytest.raises(ConfigError, match=r"decode.length_penalty_style: Input should be 'fairseq' or 'gnmt' "
                                          r"\(got 'GNMT'\) \(from --set\)"):
        load_config(path, ["decode.length_penalty_style=GNMT"])
    with pytest.raises(ConfigError, match=r"invalid decode settings: decode.length_penalty_style: Input should be "
                                          r"'fairseq' or 'gnmt'"):
        DecodeConfig().updated(length_penalty_style="wu")
    # the command line: the same line, no traceback; and a good value is taken
    assert main(["train", str(path), "--print-config"]) == 2
    assert "decode.length_penalty_style: Input should be 'fairseq' or 'gnmt' (got 'wu') (line 4)" in \
        capsys.readouterr().err
    assert main(["train", str(path), "--set", "decode.length_penalty_style=gnmt", "--print-config"]) == 0
    assert "length_penalty_style: gnmt" in capsys.readouterr().out


def test_committed_grid_cells_stay_scored_under_the_default():
    """A comparison cell is scored again when its evaluation key changes: the default style leaves the key every
    committed translation cell was scored with as it was (no new key), and only gnmt adds it."""
    from sanlab.tasks.base import task_for

    config = load_config(ROOT / "configs" / "multi30k-en-de-transformer.yaml")
    task = task_for(config)
    records = sorted((ROOT / "results" / "compare").glob("*/*/seed-*/compare-eval.json"))
    keys = [json.loads(r.read_text(encoding="utf-8"))["key"] for r in records]
    decoded = [k["decode"] for k in keys if "decode" in k]
    assert decoded, "no committed translation cell found"
    for recorded in decoded:
        assert task.eval_key(config.model_copy(update={"decode": DecodeConfig(**recorded)})) == \
            {"decode": recorded}
    gnmt = config.model_copy(update={"decode": config.decode.updated(length_penalty_style="gnmt")})
    assert task.eval_key(gnmt)["decode"]["length_penalty_style"] == "gnmt"


def _options(command: str) -> dict:
    """``sanlab COMMAND``'s options: {option string: (help, choices, type)}."""
    import argparse

    from sanlab.cli import _parser

    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {s: (a.help, a.choices, a.type) for a in sub._actions for s in a.option_strings}


def test_evaluate_takes_the_decode_options_of_translate(legacy, capsys):
    """`evaluate --length-penalty A --length-penalty-style S` scores what `translate` with them writes, records the
    values with the scores (the run's config is left as it was), and is offered as translate offers it; --n-best is
    translate's alone (evaluate scores each sentence's best). A tagging run refuses them, as it refuses --beam."""
    translate_opts, evaluate_opts = _options("translate"), _options("evaluate")
    for option in ("--beam", "--batch-sentences", "--length-penalty", "--length-penalty-style"):
        assert evaluate_opts[option] == translate_opts[option]
    assert "--n-best" in translate_opts and "--n-best" not in evaluate_opts

    config_text = (RUN / "config.yaml").read_text(encoding="utf-8")
    assert main(["evaluate", "--run", str(RUN), "--device", "cpu", "--split", "test", "--length-penalty", "0.6",
                 "--length-penalty-style", "gnmt"]) == 0
    record = json.loads((RUN / "eval-best.json").read_text(encoding="utf-8"))["test"]
    assert (record["decode"]["length_penalty"], record["decode"]["length_penalty_style"]) == (0.6, "gnmt")
    assert (RUN / "config.yaml").read_text(encoding="utf-8") == config_text
    out = Path("gnmt.txt")
    assert main(["translate", "--run", str(RUN), "--device", "cpu", "--input", "data/translation/test.src",
                 "--output", str(out), "--length-penalty", "0.6", "--length-penalty-style", "gnmt"]) == 0
    assert (RUN / "hyp-best-test.txt").read_text(encoding="utf-8") == out.read_text(encoding="utf-8")
    capsys.readouterr()
    assert main(["evaluate", "--run", "tagging", "--device", "cpu", "--length-penalty-style", "gnmt"]) == 2
    assert "is a tagging run: decode settings (length_penalty_style) do not apply" in capsys.readouterr().err
