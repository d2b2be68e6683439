"""Fixtures for the steering tests: the tiny model in memory and the SAE built for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from tasks.config import REPO_ROOT
from tests.steering.sae_folders import TINY_SAE_ID


@pytest.fixture(scope="session")
def tiny_sae_root(tiny_model_dir: Path) -> Path:
    """models/saes with the tiny model's SAE built the Makefile's way (a no-op when it is up to date)."""
    root = REPO_ROOT / "models" / "saes"
    command = [sys.executable, "-m", "scripts.build_tiny_sae", "--model", str(tiny_model_dir)]
    subprocess.run([*command, "--out", str(root / TINY_SAE_ID)], cwd=REPO_ROOT, check=True)
    return root


@pytest.fixture(scope="session")
def steering_demo(tiny_sae_root: Path) -> dict:
    return json.loads((tiny_sae_root / TINY_SAE_ID / "steering_demo.json").read_text())


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
