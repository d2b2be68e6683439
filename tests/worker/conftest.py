from __future__ import annotations

from pathlib import Path

import pytest

from tasks.config import Config


@pytest.fixture(scope="session")
def tiny_config(tiny_model_dir: Path) -> Config:
    return Config(model=str(tiny_model_dir), max_num_seqs=8)
