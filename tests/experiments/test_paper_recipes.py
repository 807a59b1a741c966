"""Every translation recipe under configs/ builds on the meta device; the paper recipes (configs/paper/) with
the parameter count docs/data.md documents, and `sanlab params CONFIG` prints it beside the paper's."""

import math
import re
from pathlib import Path

import pytest

from sanlab.config import TranslationConfig, load_config
from sanlab.experiments.params import PAPER_PARAMS, recipe_rows, translation_params

pytestmark = pytest.mark.slow  # (every paper-scale recipe built: make test runs them, the inner loop does not)

ROOT = Path(__file__).resolve().parents[2]
PAPER = sorted((ROOT / "configs" / "paper").glob("*.yaml"))
DOCUMENTED = {m[0]: int(m[1].replace(",", "")) for m in re.findall(
    r"^\| `configs/paper/([\w.-]+)\.yaml` \| ([\d,]+) \|", (ROOT / "docs" / "data.md").read_text(), re.M)}


def test_every_paper_recipe_is_documented():
    assert PAPER and sorted(DOCUMENTED) == sorted(p.stem for p in PAPER) and sorted(PAPER_PARAMS) == sorted(DOCUMENTED)


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_paper_recipe_has_its_documented_parameter_count(path):
    config = load_config(path)
    assert isinstance(config, TranslationConfig)
    assert translation_params(config) == DOCUMENTED[path.stem]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_translation_recipe_builds_on_meta(path):
    config = load_config(path)
    if not isinstance(config, TranslationConfig):
        pytest.skip("a tagger's size depends on the words of its data")
    assert translation_params(config) > 0


def test_params_of_a_grid_lists_every_row_beside_the_paper(capsys):
    from sanlab.cli import main

    rows = {name: (n, paper) for name, n, paper in recipe_rows(str(ROOT / "configs/compare/csan-table1-wmt14.yaml"))}
    assert rows["vanilla"] == (DOCUMENTED["wmt14-en-de-base"], "88.0M")
    assert rows["2D-CSAN"][0] == rows["1D-CSAN"][0] == rows["vanilla"][0]          # parameter-free, as the paper
    assert round((rows["Local_Soft"][0] - rows["vanilla"][0]) / 1e6, 1) == 0.8     # the paper's +0.8M
    assert main(["params", str(ROOT / "configs/paper/iwslt14-de-en-muse.yaml")]) == 0
    assert re.search(r"iwslt14-de-en-muse +51,222,576 +51\.2 +49M", capsys.readouterr().out)


@pytest.mark.parametrize("name, count", [("iwslt14-de-en-transformer", 42_864_640),   # MUSE Table 3: 43M
                                         ("iwslt14-de-en-muse", 48_193_584),          # released log; Table 1: 49M
                                         ("iwslt14-de-en-dynamicconv", 38_685_184)])  # MUSE Tables 1, 3: 39M
def test_iwslt_recipes_with_the_papers_dictionaries_have_the_papers_counts(name, count):
    """docs/data.md explains each IWSLT difference by the vocabularies alone: with fairseq's de 8,848 / en 6,632
    dictionaries the recipe's own model has the paper's count."""
    import torch

    from sanlab.models.builders import build_seq2seq, count_parameters

    with torch.device("meta"):
        model = build_seq2seq(load_config(ROOT / "configs" / "paper" / f"{name}.yaml").model, vocab_size=8848,
                              pad_id=0, tgt_vocab_size=6632)
    assert count_parameters(model) == count
    assert PAPER_PARAMS[name].startswith(f"{math.ceil(count / 1e6)}M")  # MUSE rounds up: 48.2M is "49M"


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_a_recipe_header_states_its_own_parameter_count(path):
    """The counts a recipe's header comment gives ("Parameters: 60.5M", "Base adds 432") are what it builds."""
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    n = translation_params(load_config(path))
    for stated in re.findall(r"Parameters: ([\d.]+)M", header):
        assert float(stated) == round(n / 1e6, 1), (path.name, stated)
    if "capsule" in path.stem:
        plain = translation_params(load_config(path.with_name(path.name.replace("-capsule", ""))))
        assert re.search(rf"\bBase adds {n - plain}\b", header), header
