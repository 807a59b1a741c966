"""The test configuration's warning filters (pyproject.toml, [tool.pytest.ini_options] filterwarnings) hide only
what torch says of itself: each process's first torch.compile imports torch._inductor, whose import of
torch/utils/mkldnn.py decorates its classes with the deprecated torch.jit.script_method (a DeprecationWarning
once per pytest-xdist worker: ~28 lines in CI). The same warning from anywhere else, and any other, still shows."""

import builtins
import warnings

import pytest

SCRIPT_METHOD = "`torch.jit.script_method` is deprecated. Please switch to `torch.compile` or `torch.export`."


def _shown(config, message: str, module: str) -> list[str]:
    """What of ``message``, warned as a DeprecationWarning from ``module``, passes the configured filters (as pytest
    applies them, over "always"; a -W on the command line, which comes after them, is left out)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for entry in config.getini("filterwarnings"):
            action, text, category, where = (entry.split(":") + ["", "", ""])[:4]
            warnings.filterwarnings(action, text, getattr(builtins, category or "Warning"), where)
        warnings.warn_explicit(message, DeprecationWarning, filename=f"{module.replace('.', '/')}.py", lineno=1,
                               module=module, registry={})
    return [str(w.message) for w in caught]


def test_torchs_own_script_method_deprecation_is_not_shown(pytestconfig):
    assert _shown(pytestconfig, SCRIPT_METHOD, "torch.jit._script") == []


@pytest.mark.parametrize("message, module", [
    (SCRIPT_METHOD, "sanlab.models.seq2seq"),
    ("`torch.jit.trace` is deprecated.", "torch.jit._script"),
    ("something else torch deprecates", "torch.nn.modules.module"),
])
def test_every_other_deprecation_is_shown(pytestconfig, message, module):
    assert _shown(pytestconfig, message, module) == [message]


def test_sanlab_itself_uses_no_torch_jit():
    """The filter goes by the module that warns, torch.jit._script, whoever calls it: a use of torch.jit in sanlab
    would be hidden by it, so there is none (torch.compile is sanlab's compiler)."""
    import re
    from pathlib import Path

    source = Path(__file__).resolve().parents[1] / "src" / "sanlab"
    uses = [str(p.relative_to(source)) for p in sorted(source.rglob("*.py"))
            if re.search(r"\bjit\b", p.read_text(encoding="utf-8"))]
    assert uses == []
