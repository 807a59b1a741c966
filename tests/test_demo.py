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
    # run again into the same directory: its corpora are the demo's own, its runs are replaced
    (tmp_path / "demo" / "data" / "translation" / "notes.txt").write_text("mine\n")
    assert main(["demo", "--run", str(tmp_path / "demo"), "--quick"]) == 2
    assert "holds files the demo did not write (notes.txt)" in capsys.readouterr().err


def test_the_demo_writes_over_nothing_of_the_users(tmp_path, capsys):
    """A user's file where the demo writes its corpora, or in one of its run directories: refused before the
    demo writes anything, and the file is as it was."""
    root = tmp_path / "p"
    (root / "data" / "translation").mkdir(parents=True)
    mine = root / "data" / "translation" / "train.src"
    mine.write_text("my own corpus\n")
    assert main(["demo", "--run", str(root), "--quick"]) == 2
    assert f"{mine.parent}: holds files the demo did not write (train.src)" in capsys.readouterr().err
    assert mine.read_text() == "my own corpus\n" and sorted(p.name for p in mine.parent.iterdir()) == ["train.src"]
    assert sorted(p.name for p in (root / "data").iterdir()) == ["translation"]  # the aside copy is gone too
    other = tmp_path / "q"
    (other / "tagging").mkdir(parents=True)
    (other / "tagging" / "notes.txt").write_text("x\n")
    assert main(["demo", "--run", str(other), "--quick"]) == 2
    assert "not a sanlab run directory" in capsys.readouterr().err
    assert sorted(p.name for p in other.iterdir()) == ["tagging"]  # no corpus written before the refusal


def test_the_demos_total_time_is_shown_true_below_a_second():
    """It printed "total time 0s" for work under a second (the shared duration formatter now)."""
    from pathlib import Path

    from sanlab.demo import closing_line

    assert closing_line(0.4, Path("d")) == "total time 0.4s; runs in d"
    assert closing_line(125.4, Path("d")) == "total time 125s; runs in d"
