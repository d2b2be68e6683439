"""Fixtures for the steering tests: the tiny model in memory (the SAE built for it is in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
