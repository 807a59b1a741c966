from __future__ import annotations

import os
from pathlib import Path

import pytest

# Real data lives beside the project (../shared/data); a user's clone does not have it.
SHARED_DATA = Path(os.environ.get("SANLAB_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _deterministic():
    import torch  # here, not at the top: pytest-xdist's controlling process loads this file and runs no test

    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny tensors: one thread is faster and steadier on a shared 2-core machine
    yield


@pytest.fixture(autouse=True, scope="session")
def _data_cache(tmp_path_factory):
    """Prepared data (sanlab.data.cache) goes to a directory of this test session, not the user's cache;
    subprocesses inherit it."""
    os.environ["SANLAB_CACHE_DIR"] = str(tmp_path_factory.mktemp("sanlab-cache"))
    yield


@pytest.fixture(autouse=True, scope="session")
def _no_fsync():
    """os.fsync does nothing in the test processes: every sanlab.files write still opens, flushes and renames
    as it does for a user, only the wait for the disk is left out (a test's files live as long as its process
    and never see a power cut). The fsyncs were ~8% of the fast suite's time, the most of any one call."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", lambda fd: None)
        yield


# torch.compile's cache (/tmp/torchinductor_$USER, or TORCHINDUCTOR_CACHE_DIR) is left where torch puts it, not moved
# into this session's directory: it is one directory per user, reused by every session, and warm it makes the CPU
# inductor tests (tests/attention/test_banded.py's compiled plans) about 4x faster than a cold one would.


@pytest.fixture
def shared_data() -> Path:
    if not (SHARED_DATA / "README.md").exists():
        pytest.skip(f"real data not found at {SHARED_DATA} (set SANLAB_SHARED_DATA or place ../shared/data)")
    return SHARED_DATA


@pytest.fixture
def shared_file(shared_data):
    """``shared_file("multi30k/train.en.gz")``: that file of the real data, or a skip naming the one missing
    (a partial copy of ../shared/data skips instead of failing with FileNotFoundError)."""
    def need(relative: str) -> Path:
        path = shared_data / relative
        if not path.is_file():
            pytest.skip(f"real data file {relative} not found under {shared_data}")
        return path
    return need


# Let tests import the shared helpers module (tests/tests_helpers.py) under importlib import mode.
import sys  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
