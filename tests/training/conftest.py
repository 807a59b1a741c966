import shutil
from pathlib import Path

import pytest

from training_fixtures import make_reverse_config

RUNDIR_V1 = Path(__file__).resolve().parents[1] / "fixtures" / "rundir-v1"


# what torchrun (a /tmp/torchelastic_* log directory unless given one: PET_LOG_DIR) and `sanlab train --nproc`'s
# launcher (sanlab-launch-*) make in the temporary directory; neither may stay there after a test
LAUNCH_TEMP_NAMES = ("torchelastic_*", "sanlab-launch-*")


@pytest.fixture
def private_tmpdir(tmp_path, monkeypatch):
    """A temporary directory of this test's own (TMPDIR for its subprocesses, ``tempfile``'s for this process), so
    that what the test's own torchrun and launcher leave behind can be told apart from the /tmp/torchelastic_* other
    processes make meanwhile; at the end nothing of theirs (LAUNCH_TEMP_NAMES) may be left in it."""
    import tempfile

    temp = tmp_path / "tmpdir"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # (cached by tempfile at its first use)
    yield temp
    left = sorted(p.name for pattern in LAUNCH_TEMP_NAMES for p in temp.glob(pattern))
    assert left == [], f"left behind in the test's temporary directory {temp}: {left}"


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
