import pytest

from training_fixtures import make_reverse_config


@pytest.fixture
def tiny_translation(tmp_path):
    return lambda **train: make_reverse_config(tmp_path, **train)
