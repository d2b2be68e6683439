"""scripts/build_tiny_sae.py: an SAELens-format SAE that fits the tiny model, with working demo features."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from steering.hook_points import check_sae_fits
from steering.model_layout import ModelLayout
from steering.registry import SAEListing, SAERegistry

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_build(model_dir: Path, out: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "scripts.build_tiny_sae", "--model", str(model_dir), "--out", str(out)]
    result = subprocess.run(
        [*command, "--train-steps", "20"], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def sae_root(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("saes")
    run_build(tiny_model_dir, root / "tiny" / "resid_post_2")
    return root


def test_output_is_listed_and_fits_the_model(sae_root: Path, tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    registry = SAERegistry(sae_root)
    assert registry.listings() == [
        SAEListing("tiny/resid_post_2", "blocks.2.hook_resid_post", model.config.hidden_size, 512, "standard")
    ]
    check_sae_fits(ModelLayout.of(model), registry.get("tiny/resid_post_2").config)


def test_cfg_is_sae_lens_6_shaped(sae_root: Path) -> None:
    cfg = json.loads((sae_root / "tiny" / "resid_post_2" / "cfg.json").read_text())
    assert cfg["architecture"] == "standard" and cfg["metadata"]["hook_name"] == "blocks.2.hook_resid_post"
    assert cfg["metadata"]["sae_lens_version"].startswith("6.")


def test_demo_features_point_at_their_tokens_logit(sae_root: Path, tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sae = SAERegistry(sae_root).get("tiny/resid_post_2")
    demo = json.loads((sae_root / "tiny" / "resid_post_2" / "steering_demo.json").read_text())
    assert [feature["token"] for feature in demo["features"]] == [" blue", " cats", " honey"]
    gain, unembeddings = model.model.norm.weight.detach(), model.lm_head.weight.detach()
    for feature in demo["features"]:
        direction = sae.W_dec[feature["index"]]
        assert torch.allclose(direction.norm(), torch.tensor(1.0))
        assert int((unembeddings @ (gain * direction)).argmax()) == feature["token_id"]  # it out-scores every token
        own = gain * unembeddings[feature["token_id"]]  # and stays near the direction that raises it most
        assert torch.nn.functional.cosine_similarity(direction, own, dim=0) > 0.7
        assert feature["strength"] > 0


def test_a_second_run_is_a_no_op(sae_root: Path, tiny_model_dir: Path) -> None:
    result = run_build(tiny_model_dir, sae_root / "tiny" / "resid_post_2")
    assert "is up to date" in result.stderr
