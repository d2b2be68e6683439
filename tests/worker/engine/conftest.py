"""Fixtures of the engine tests that several files share."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import PreTrainedModel

from tests.worker.family_configs import LLAMA_SHAPED_FAMILIES, MOE_FAMILIES, OTHER_LAYOUT_FAMILIES, write_family_model


@pytest.fixture(scope="module")
def family_models(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, PreTrainedModel]]:
    """Each family's model folder and the same weights in HF, written once for the module."""
    root = tmp_path_factory.mktemp("families")
    families = OTHER_LAYOUT_FAMILIES + LLAMA_SHAPED_FAMILIES + MOE_FAMILIES
    return {family: write_family_model(family, root / family, tiny_model_dir) for family in families}
