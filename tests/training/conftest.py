import shutil
from pathlib import Path

import pytest

from training_fixtures import make_reverse_config

RUNDIR_V1 = Path(__file__).resolve().parents[1] / "fixtures" / "rundir-v1"


@pytest.fixture
def tiny_translation(tmp_path):
    return lambda **train: make_reverse_config(tmp_path, **train)


@pytest.fixture
def legacy(tmp_path, monkeypatch):
    """A copy of tests/fixtures/rundir-v1 (a tiny translation and tagging run, made by
    tests/fixtures/make_rundir_v1.py), the working directory at its root (its configs name the data from there)."""
    from fixtures.make_rundir_v1 import write_data

    root = tmp_path / "v1"
    shutil.copytree(RUNDIR_V1, root)
    write_data(root)  # the corpora are not committed: written again, byte for byte
    monkeypatch.chdir(root)
    return root
