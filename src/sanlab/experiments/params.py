"""Parameter counts of the CSAN comparison table (Yang et al., NAACL 2019, Table 1; spec B and D.1).

Builds Transformer-Base (preset ``transformer_base``) once plainly and once per variant with the
variant's config overrides, and reports (variant, parameters, delta to vanilla). Models are built
on the ``meta`` device: shapes only, no memory, no initialisation cost.

    python -m sanlab.experiments.params
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from sanlab.config import Seq2SeqConfig
from sanlab.config_yaml import PRESETS, load_raw
from sanlab.models.builders import build_seq2seq, count_parameters

_ENC_PARTS = "encoder.attention.parts"
_WU_KERNELS = [3, 7, 15, 31, 31, 31]  # Wu et al.'s kernel width per layer
_DEC_PARTS = "decoder.attention.parts"

# The presets the table is built over: plain Transformers. The others have a mixer of their own, which the
# variants' keys are applied over (a dynamic_conv preset's six kernel widths in a 12-layer MUSE stack).
TABLE_PRESETS = ("transformer_base", "transformer_big")

# Each variant: dotted model keys -> value, applied over the preset (spec B.0-B.7 defaults).
BASELINES: dict[str, dict[str, object]] = {
    "Transformer-Base": {},
    "+ Bi_Direct": {_ENC_PARTS: [{"type": "bi_direct"}]},
    "+ Rel_Pos": {_ENC_PARTS: [{"type": "rel_pos"}], _DEC_PARTS: [{"type": "rel_pos"}]},
    "+ Neighbor": {_ENC_PARTS: [{"type": "neighbor"}]},
    "+ Local_Hard": {_ENC_PARTS: [{"type": "local_hard"}]},
    "+ Local_Soft": {_ENC_PARTS: [{"type": "local_soft"}]},
    "+ Block": {"encoder.mixer": {"type": "block"}},
    "+ Block (reference)": {"encoder.mixer": {"type": "block", "block_mode": "reference"}},
    "+ CNNs": {"encoder.pre_blocks": [{"type": "conv"}]},
    "+ CNNs (full conv)": {"encoder.pre_blocks": [{"type": "conv", "conv_type": "full"}]},
    "+ 1D-CSAN": {_ENC_PARTS: [{"type": "window", "size": 11, "layers": [0, 1, 2]}]},
    "+ 2D-CSAN": {_ENC_PARTS: [{"type": "csan2d", "size": 11, "heads_area": 3, "layers": [0, 1, 2]}]},
    "+ Capsule routing": {_ENC_PARTS: [{"type": "capsule"}], _DEC_PARTS: [{"type": "capsule"}]},
    "MUSE (parallel block)": {"encoder.mixer": {"type": "muse"}, "decoder.mixer": {"type": "muse"}},
    "DynamicConv (no attention)": {"encoder.mixer": {"type": "dynamic_conv", "kernel_size": _WU_KERNELS},
                                   "decoder.mixer": {"type": "dynamic_conv", "kernel_size": _WU_KERNELS}},
    "LightConv (no attention)": {"encoder.mixer": {"type": "light_conv", "kernel_size": _WU_KERNELS},
                                 "decoder.mixer": {"type": "light_conv", "kernel_size": _WU_KERNELS}},
    "MUSE_FF (attention || FFN)": {"encoder.mixer": {"type": "muse_ff"}, "decoder.mixer": {"type": "muse_ff"}},
    # Dufter et al.'s parts in the encoder; P, R and Conv grow with t = model.max_positions (1,024 here).
    "+ P (layer 0)": {_ENC_PARTS: [{"type": "abs_position"}]},
    "+ R (layer 0)": {_ENC_PARTS: [{"type": "rel_position"}]},
    "+ Temp": {_ENC_PARTS: [{"type": "temperature"}]},
    "+ Conv (1D)": {_ENC_PARTS: [{"type": "conv_attention", "dims": 1}]},
    "+ Conv2d": {_ENC_PARTS: [{"type": "conv_attention", "dims": 2}]},
}

# Added parameters the papers report (Table 1, both versions), for the printed comparison.
PUBLISHED_DELTA_M = {"+ Bi_Direct": 0.0, "+ Rel_Pos": 0.1, "+ Neighbor": 0.4, "+ Local_Hard": 0.4,
                     "+ Local_Soft": 0.8, "+ Block": 6.0, "+ CNNs": 42.6, "+ 1D-CSAN": 0.0, "+ 2D-CSAN": 0.0}


@dataclass(frozen=True)
class ParamRow:
    variant: str
    params: int
    delta: int  # versus the first (vanilla) row


def _set(tree: dict, dotted: str, value: object) -> None:
    *path, last = dotted.split(".")
    for key in path:
        tree = tree.setdefault(key, {})
    tree[last] = value


def model_config(overrides: dict[str, object], *, preset: str = "transformer_base") -> Seq2SeqConfig:
    """The preset's model section with dotted ``overrides`` applied."""
    raw = load_raw(PRESETS / f"{preset}.yaml").get("model", {})
    for dotted, value in overrides.items():
        _set(raw, dotted, value)
    return Seq2SeqConfig.model_validate(raw)


def count_model(config: Seq2SeqConfig, *, vocab_size: int) -> int:
    with torch.device("meta"):  # parameter shapes only
        return count_parameters(build_seq2seq(config, vocab_size=vocab_size, pad_id=0))


def parameter_table(variants: dict[str, dict[str, object]] | None = None, *, preset: str = "transformer_base",
                    vocab_size: int = 37000) -> list[ParamRow]:
    """One row per variant; the first variant is the reference for ``delta``. The deltas do not depend
    on ``vocab_size`` (37k shared: Vaswani et al.'s base setting)."""
    variants = BASELINES if variants is None else variants
    counts = {name: count_model(model_config(o, preset=preset), vocab_size=vocab_size) for name, o in variants.items()}
    base = next(iter(counts.values()))
    return [ParamRow(name, n, n - base) for name, n in counts.items()]


def format_table(rows: list[ParamRow]) -> str:
    lines = [f"{'variant':<28} {'params':>12} {'delta':>12} {'delta (M)':>10} {'paper':>8}"]
    for row in rows:
        paper = PUBLISHED_DELTA_M.get(row.variant)
        lines.append(f"{row.variant:<28} {row.params:>12,} {row.delta:>+12,} {row.delta / 1e6:>+10.1f} "
                     f"{'' if paper is None else f'+{paper:.1f}':>8}")
    return "\n".join(lines)


# Published sizes of the configs/paper recipes, for `sanlab params CONFIG` (docs/data.md says why ours differ).
PAPER_PARAMS = {
    "wmt14-en-de-base": "88.0M (CSAN Table 1)",
    "wmt14-en-de-base-csan": "88.0M (CSAN Table 1: 2D-CSAN adds none)",
    "iwslt14-de-en-transformer": "43M (MUSE Table 3; 42,864,640 with their dictionaries)",
    "iwslt14-de-en-muse": "49M (MUSE Table 1; 48,193,584 in its released log)",
    "iwslt14-de-en-dynamicconv": "39M (MUSE Tables 1, 3; 38,685,184 with their dictionaries)",
    "iwslt14-de-en-lightconv": "not given (Wu et al. IWSLT model)",
    "wmt14-en-de-big": "not given (CSAN Table 2)",
    "wmt14-en-de-big-csan": "not given (CSAN Table 2)",
    "wmt17-zh-en-base": "not given (capsule-Transformer Table 1)",
    "wmt17-zh-en-base-capsule": "+1.6K over Big (capsule-Transformer text); Base adds 432",
}


def translation_params(config) -> int:
    """Parameters of a translation recipe's model at its configured vocabulary size (sentencepiece reaches it
    on any corpus of real size; a tiny one may give fewer pieces), built on the meta device."""
    sw = config.data.subword
    with torch.device("meta"):
        model = build_seq2seq(config.model, vocab_size=sw.vocab_size, pad_id=0,
                              tgt_vocab_size=None if sw.joint else sw.vocab_size)
    return count_parameters(model)


def recipe_rows(path: str, overrides: list[str] = ()) -> list[tuple[str, int, str]]:
    """(name, parameters, the paper's) of a translation recipe, or of every variant of a comparison grid."""
    from pathlib import Path

    from sanlab.config import load_config
    from sanlab.config_yaml import read_yaml_mapping
    from sanlab.errors import ConfigError
    from sanlab.experiments.grid import load_grid
    from sanlab.tasks.base import task_for

    if "variants" in read_yaml_mapping(Path(path)):
        grid = load_grid(path, overrides=list(overrides))
        cells = {c.variant: c for c in grid.cells}
        rows = [(v.name, cells[v.name].config, str(grid.paper(dataset=cells[v.name].dataset, variant=v.name)
                                                  .get("params", ""))) for v in grid.spec.variants]
    else:
        rows = [(Path(path).stem, load_config(path, overrides), PAPER_PARAMS.get(Path(path).stem, ""))]
    if not all(task_for(config).supports("params") for _, config, _ in rows):
        raise ConfigError(f"{path}: sanlab params CONFIG counts translation recipes (a tagger's size depends on "
                          "the words of its data); sanlab params alone prints the variants at Base size")
    return [(name, translation_params(config), paper) for name, config, paper in rows]


def format_recipe_rows(rows: list[tuple[str, int, str]]) -> str:
    width = max(len("recipe"), *(len(name) for name, _, _ in rows))
    lines = [f"{'recipe':<{width}} {'params':>13} {'(M)':>7}  paper"]
    lines += [f"{name:<{width}} {n:>13,} {n / 1e6:>7.1f}  {paper}" for name, n, paper in rows]
    return "\n".join(lines)


def main(preset: str = "transformer_base") -> None:
    print(f"Parameters of Transformer variants ({preset}, shared 37k vocabulary; delta vs the first row; "
          "'paper': the CSAN table's added parameters; Dufter's P, R and Conv scale with t = model.max_positions)")
    rows = parameter_table(preset=preset)
    plain = {"transformer_base": "Transformer-Base", "transformer_big": "Transformer-Big"}[preset]
    print(format_table([dataclasses.replace(r, variant=plain) if k == 0 else r for k, r in enumerate(rows)]))


if __name__ == "__main__":
    main()
