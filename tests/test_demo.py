"""``sanlab demo --quick``: the whole pipeline on the project's own synthetic data, end to end."""

import pytest

from sanlab.cli import main


@pytest.mark.slow
def test_quick_demo_runs_end_to_end(tmp_path, capsys):
    assert main(["demo", "--run", str(tmp_path / "demo"), "--quick"]) == 0
    out = capsys.readouterr().out
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in out  # the sacreBLEU signature is printed
    assert "OOV" in out and "ambiguous" in out
    for run in ("translation", "tagging"):
        assert (tmp_path / "demo" / run / "eval-best.json").exists()
