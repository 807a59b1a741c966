"""bench/grid_speed.py runs end to end on the shipped smoke grid and reports every variant against
the baseline (the numbers themselves are measurements, never asserted)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_grid_speed_reports_every_variant_against_the_baseline(tmp_path):
    out = tmp_path / "speed.md"
    subprocess.run([sys.executable, str(ROOT / "bench" / "grid_speed.py"), "configs/compare/smoke-synthetic.yaml",
                    "--threads", "1", "--updates", "1", "--rounds", "2", "--warmup", "0", "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True)
    rows = [line.strip("| ").split(" | ") for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == ["SAN+PE[add] (baseline)", "1D-CSAN"]
    assert rows[0][4] == "1.00" and len(rows[1][5].split()) == 2  # the ratio to itself; one rate per round
