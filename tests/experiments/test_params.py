"""The parameter column of the CSAN comparison table (spec B.8, D.1), on Transformer-Base."""

import pytest

from sanlab.experiments.params import BASELINES, format_table, model_config, parameter_table

D, H, HEAD = 512, 8, 64


@pytest.fixture(scope="module")
def deltas() -> dict[str, int]:
    return {row.variant: row.delta for row in parameter_table()}


def test_vanilla_is_the_transformer_base_preset(deltas):
    # the same count as tests/models/test_seq2seq.py::test_presets_match_vaswani with a 37k vocabulary
    d, f, v = D, 2048, 37000
    enc = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d
    dec = 2 * (4 * d * d + 4 * d) + 2 * d * f + f + d + 6 * d
    assert parameter_table({"base": {}})[0].params == v * d + 6 * enc + 6 * dec
    assert deltas["Transformer-Base"] == 0


def test_parameter_free_and_relative_position_baselines(deltas):
    assert deltas["+ Bi_Direct"] == deltas["+ 1D-CSAN"] == deltas["+ 2D-CSAN"] == 0
    k = 16
    assert deltas["+ Rel_Pos"] == 12 * 2 * (2 * k + 1) * HEAD == 50_688  # 12 self-attention layers, +0.1M


def test_gaussian_baselines_reproduce_the_table(deltas):
    predictor = lambda local, outputs: D * local * HEAD + local * HEAD + local * HEAD * outputs + outputs  # noqa: E731
    assert deltas["+ Neighbor"] == 3 * predictor(4, 4) == 397_068  # +0.4M: H_loc = 4, layers 0-2
    assert deltas["+ Local_Hard"] == 397_068
    assert deltas["+ Local_Soft"] == 3 * predictor(8, 16) == 812_592  # +0.8M: all heads, P and D


def test_block_and_cnn_counts_are_ours_not_the_table(deltas):
    c = D // 2
    bibosan = 2 * ((D * c + c) + (2 * c * c + c) + (c * c + c) + (5 * c * c + 5 * c) + (6 * c * c + 2 * c))
    mha = 4 * D * D + 4 * D
    assert deltas["+ Block"] == 3 * (bibosan - mha)  # 3.15M, the table says +6.0M (spec B.5)
    assert deltas["+ Block (reference)"] == 3 * (5 * D * D + 3 * D + D * H + H)
    separable = 7 * D + D * D + D + 2 * D
    assert deltas["+ CNNs"] == 3 * 4 * separable  # 3.2M, the table says +42.6M (spec B.6)
    assert deltas["+ CNNs (full conv)"] == 3 * 4 * (7 * D * D + D + 2 * D)


def test_the_other_papers_parts_on_transformer_base(deltas):
    t, layers = 1024, 6  # Dufter's parts: t = model.max_positions; P and R in layer 0 only
    assert deltas["+ P (layer 0)"] == H * t * t
    assert deltas["+ R (layer 0)"] == H * 2 * t
    assert deltas["+ Temp"] == layers * H * 3
    assert deltas["+ Conv2d"] == layers * H * (3 * 3 + 1)
    assert deltas["MUSE_FF (attention || FFN)"] < 0 and deltas["LightConv (no attention)"] < 0


def test_overrides_are_validated_and_the_table_prints():
    assert model_config(BASELINES["+ Local_Soft"]).encoder.attention.parts[0].type == "local_soft"
    text = format_table(parameter_table({"a": {}, "b": BASELINES["+ Rel_Pos"]}))
    assert "+50,688" in text
