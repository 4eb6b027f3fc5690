from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fixture_model_dir() -> Path:
    """The trained default model, from the normal cache (built once, minutes on 2 cores, when absent)."""
    from quantbench.fixture import default_model_dir

    return default_model_dir(progress=False)
