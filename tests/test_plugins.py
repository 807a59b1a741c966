"""A researcher's own part, mixer and pre-block, in their own package, registered through entry points
(docs/variants.md, "Adding a variant"): found, parsed from a config dict, built and run, without forking sanlab.

The package is written to a temporary folder with a ``*.dist-info`` (METADATA + entry_points.txt), which is
what ``pip install`` leaves and what ``importlib.metadata`` reads; nothing is installed and nothing is
downloaded. The model runs in a fresh interpreter, so the registries discover the plug-in from scratch.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sanlab.errors import ConfigError
from sanlab.registry import ComponentConfig, Registry

pytestmark = pytest.mark.slow  # (fresh interpreters per case: make test runs them, the inner loop does not)

PLUGIN = {
    "my_variants/__init__.py": "",
    # torch-free: the schema validates a config that names these without importing torch
    "my_variants/config.py": '''
        from typing import Literal

        from pydantic import Field

        from sanlab.attention.registry import PartConfig
        from sanlab.layers.mixers import MixerConfig
        from sanlab.layers.pre_blocks import PreBlockConfig


        class DistancePenaltyConfig(PartConfig):
            type: Literal["distance_penalty"] = "distance_penalty"
            builder = "my_variants.modules:build_distance_penalty"
            slope: float = Field(0.5, ge=0)


        class MeanMixerConfig(MixerConfig):
            type: Literal["mean"] = "mean"
            builder = "my_variants.modules:build_mean_mixer"


        class LinearPreBlockConfig(PreBlockConfig):
            type: Literal["linear"] = "linear"
            builder = "my_variants.modules:build_linear_pre_block"
        ''',
    "my_variants/modules.py": '''
        import torch
        from torch import nn

        from sanlab.attention import AttentionOutput, AttentionPart


        class DistancePenalty(AttentionPart):
            """scores - slope_h |i - j|, a learned slope per head."""

            def __init__(self, *, heads, slope):
                super().__init__()
                self.slope = nn.Parameter(torch.full((heads,), slope))

            def score(self, scores, ctx):
                distance = (ctx.q_pos[:, None] - ctx.k_pos[None, :]).abs().to(scores.dtype)  # [i, j]
                return scores - self.slope[:, None, None] * distance  # [b, h, i, j]


        class MeanMixer(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.proj = nn.Linear(dim, dim)

            def forward(self, x, *, positions, cache=None, use_cache=False, need_trace=False):
                out = self.proj(x.mean(dim=1, keepdim=True)).expand_as(x)  # [b, i, d]
                return AttentionOutput(out, None, {} if need_trace else None)


        class LinearPreBlock(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.linear = nn.Linear(dim, dim)

            def forward(self, x, *, positions):
                return x + self.linear(x)


        def build_distance_penalty(config, ctx):
            return DistancePenalty(heads=ctx.heads, slope=config.slope)


        def build_mean_mixer(config, ctx, *, attention):
            return MeanMixer(ctx.dim)


        def build_linear_pre_block(config, ctx, *, norm, dropout):
            return LinearPreBlock(ctx.dim)
        ''',
    "my_variants-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: my-variants\nVersion: 0.1\n",
    "my_variants-0.1.dist-info/entry_points.txt": '''
        [sanlab.parts]
        distance_penalty = my_variants.config:DistancePenaltyConfig

        [sanlab.mixers]
        mean = my_variants.config:MeanMixerConfig

        [sanlab.pre_blocks]
        linear = my_variants.config:LinearPreBlockConfig
        ''',
}

RUN = '''
    import sys

    import yaml

    from sanlab.config import dump_config, validate

    files = {"src": "a", "tgt": "b"}  # validating does not read them
    raw = {"task": "translation", "data": {"train": files, "valid": files, "max_len": 30},
           "model": {"dim": 16, "max_positions": 32,
                     "encoder": {"layers": 2, "ffn_dim": 24, "pre_blocks": [{"type": "linear", "layers": [0]}],
                                 "attention": {"heads": 4, "parts": [{"type": "distance_penalty", "slope": 0.25}]},
                                 "mixer": {"type": "mean", "layers": [1]}},
                     "decoder": {"layers": 1, "ffn_dim": 24,
                                 "attention": {"heads": 4, "parts": [{"type": "distance_penalty"}]}}}}
    config = validate(raw, source="plugin test")
    assert "torch" not in sys.modules, "validating the plug-in's config imported torch"
    assert validate(yaml.safe_load(dump_config(config)), source="dumped") == config

    import torch

    from sanlab.models.builders import build_seq2seq

    torch.manual_seed(0)
    model = build_seq2seq(config.model, vocab_size=20, pad_id=0)
    enc, dec = model.encoder.layers, model.decoder.layers
    assert [type(b).__name__ for b in enc[0].pre_blocks] == ["LinearPreBlock"] and not enc[1].pre_blocks
    assert type(enc[0].mixer).__name__ == "Attention" and type(enc[1].mixer).__name__ == "MeanMixer"
    assert [type(p).__name__ for p in enc[0].mixer.parts] == ["DistancePenalty"]
    assert dec[0].self_mixer.parts[0].slope.tolist() == [0.5] * 4
    logits = model(torch.randint(4, 20, (2, 7)), torch.randint(4, 20, (2, 5)))  # [b, i, V]
    assert logits.shape == (2, 5, 20) and torch.isfinite(logits).all()
    logits.sum().backward()
    assert enc[0].mixer.parts[0].slope.grad is not None
    print("plugin ok")
'''


def write_plugin(root: Path) -> Path:
    for name, text in PLUGIN.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


def test_a_plugin_part_mixer_and_pre_block_parse_build_and_run(tmp_path):
    site = write_plugin(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(RUN)], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "plugin ok"


# ----------------------------------------------------------------------------- the kernel's checks
class GoodConfig(ComponentConfig):
    type: str = "good"
    builder = "tests.nowhere:build"


class NoBuilderConfig(GoodConfig):
    type: str = "no_builder"


def _registry(**builtin: str) -> Registry:
    return Registry("test part", group="sanlab.test_plugins", builtin=builtin)


def test_the_registry_imports_nothing_before_a_name_is_used():
    registry = _registry(good=f"{__name__}:GoodConfig", broken="no_such_module_anywhere:Config")
    assert registry.names() == ["broken", "good"]
    assert registry.entry("good").config is GoodConfig
    with pytest.raises(ConfigError, match="test part 'broken': cannot load no_such_module_anywhere:Config"):
        registry.entry("broken")


@pytest.mark.parametrize("name, reference, problem", [
    ("no_builder", f"{__name__}:NoBuilderConfig", "'no_builder' .*declares no builder"),
    ("other", f"{__name__}:GoodConfig", "'other' .*type default 'good' must be the name it is registered under"),
    ("other", f"{__name__}:PLUGIN", "'other' .*must be a ComponentConfig subclass"),
])
def test_a_malformed_entry_is_refused_with_its_name(name, reference, problem):
    with pytest.raises(ConfigError, match=problem):
        _registry(**{name: reference}).entry(name)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="unknown test part type 'nope'; known: good"):
        _registry(good=f"{__name__}:GoodConfig").parse({"type": "nope"})


def test_an_entry_point_may_not_take_a_built_in_name(tmp_path, monkeypatch):
    info = tmp_path / "clash-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clash\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[sanlab.test_plugins]\ngood = clash:Config\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="test part 'good' is registered twice"):
        _registry(good=f"{__name__}:GoodConfig").names()


def test_a_config_class_registers_in_process():
    registry = _registry()

    @registry.register
    class LocalConfig(ComponentConfig):
        type: str = "local"
        builder = "tests.nowhere:build"

    assert registry.names() == ["local"] and registry.parse({"type": "local", "layers": [1]}) == LocalConfig(layers=[1])
    with pytest.raises(ConfigError, match="'local' is registered twice"):
        registry.register(LocalConfig)
