"""steering/sae_config.py and SAE.load: both SAELens cfg layouts, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from steering.sae import SAE
from steering.sae_config import SAEConfig
from tests.steering.sae_folders import random_tensors, sae_lens_6_cfg, write_sae_folder

# A pre-6 SAELens cfg.json (flat, `hook_point`, boolean normalization, top-k via the activation function).
PRE_6_TOPK_CFG = {
    "model_name": "gpt2-small",
    "hook_point": "blocks.8.hook_resid_pre",
    "hook_point_layer": 8,
    "d_in": 768,
    "d_sae": 24576,
    "dtype": "torch.float32",
    "activation_fn_str": "topk",
    "activation_fn_kwargs": {"k": 32},
    "apply_b_dec_to_input": False,
    "normalize_activations": False,
    "sae_lens_training_version": "3.13.0",
}


def test_reads_sae_lens_6_layout_with_hook_name_under_metadata() -> None:
    config = SAEConfig.from_dict(sae_lens_6_cfg(128, 512, "blocks.2.hook_resid_post", "topk", k=16))
    assert config == SAEConfig(
        d_in=128, d_sae=512, hook_name="blocks.2.hook_resid_post", architecture="topk", k=16, model_name="tiny"
    )


def test_reads_pre_6_flat_layout() -> None:
    config = SAEConfig.from_dict(PRE_6_TOPK_CFG)
    assert (config.hook_name, config.architecture, config.k) == ("blocks.8.hook_resid_pre", "topk", 32)
    assert (config.apply_b_dec_to_input, config.normalize_activations) == (False, "none")


def test_missing_architecture_means_standard_and_metadata_architecture_is_read() -> None:
    flat = {"d_in": 4, "d_sae": 8, "hook_name": "blocks.0.hook_resid_pre"}
    assert SAEConfig.from_dict(flat).architecture == "standard"
    nested = {"d_in": 4, "d_sae": 8, "metadata": {"hook_name": "blocks.0.hook_resid_pre", "architecture": "jumprelu"}}
    assert SAEConfig.from_dict(nested).architecture == "jumprelu"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architecture": "gated"}, "architecture 'gated' is not supported"),
        ({"architecture": "batchtopk"}, "architecture 'batchtopk' is not supported"),
        ({"d_in": None}, "d_in must be a positive integer"),
        ({"d_sae": -3}, "d_sae must be a positive integer"),
        ({"metadata": {}}, "hook_name is missing"),
        ({"architecture": "topk"}, "topk SAE needs k"),
        ({"architecture": "topk", "k": 9000}, "topk SAE needs k"),
        ({"normalize_activations": "expected_average_only_in"}, "normalize_activations"),
        ({"normalize_activations": True}, "normalize_activations"),
    ],
)
def test_refuses_what_it_cannot_run(change: dict, message: str) -> None:
    raw = sae_lens_6_cfg(128, 512, "blocks.2.hook_resid_post") | change
    with pytest.raises(ValueError, match=message):
        SAEConfig.from_dict(raw)


def test_missing_d_in_key_is_named() -> None:
    raw = sae_lens_6_cfg(128, 512, "blocks.2.hook_resid_post")
    del raw["d_in"]
    with pytest.raises(ValueError, match="d_in is missing"):
        SAEConfig.from_dict(raw)


def test_load_reads_weights_and_config(tmp_path: Path) -> None:
    tensors = random_tensors(4, 8, threshold=True)
    write_sae_folder(tmp_path, sae_lens_6_cfg(4, 8, "blocks.0.hook_resid_pre", "jumprelu"), tensors)
    sae = SAE.load(tmp_path)
    assert sae.config.architecture == "jumprelu"
    assert torch.equal(sae.W_enc, tensors["W_enc"]) and torch.equal(sae.threshold, tensors["threshold"])


def test_load_converts_pre_6_log_threshold(tmp_path: Path) -> None:
    tensors = random_tensors(4, 8)
    tensors["log_threshold"] = torch.full((8,), -1.0)
    write_sae_folder(tmp_path, sae_lens_6_cfg(4, 8, "blocks.0.hook_resid_pre", "jumprelu"), tensors)
    assert torch.allclose(SAE.load(tmp_path).threshold, torch.full((8,), torch.e**-1))


@pytest.mark.parametrize(("drop", "message"), [("threshold", "threshold is missing"), ("b_enc", "b_enc is missing")])
def test_load_refuses_missing_tensors(tmp_path: Path, drop: str, message: str) -> None:
    tensors = random_tensors(4, 8, threshold=True)
    del tensors[drop]
    write_sae_folder(tmp_path, sae_lens_6_cfg(4, 8, "blocks.0.hook_resid_pre", "jumprelu"), tensors)
    with pytest.raises(ValueError, match=message):
        SAE.load(tmp_path)


def test_load_refuses_shapes_that_disagree_with_cfg(tmp_path: Path) -> None:
    write_sae_folder(tmp_path, sae_lens_6_cfg(4, 16, "blocks.0.hook_resid_pre"), random_tensors(4, 8))
    with pytest.raises(ValueError, match=r"W_enc has shape \(4, 8\), cfg.json implies \(4, 16\)"):
        SAE.load(tmp_path)


def test_load_refuses_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cfg\.json does not exist"):
        SAE.load(tmp_path)
    (tmp_path / "cfg.json").write_text('{"d_in": 4, "d_sae": 8, "hook_name": "blocks.0.hook_resid_pre"}')
    with pytest.raises(ValueError, match=r"sae_weights\.safetensors does not exist"):
        SAE.load(tmp_path)


def test_load_never_unpickles(tmp_path: Path) -> None:
    """A pickle under the weights' name is refused as unreadable, not executed."""
    write_sae_folder(tmp_path, sae_lens_6_cfg(4, 8, "blocks.0.hook_resid_pre"), random_tensors(4, 8))
    torch.save(random_tensors(4, 8), tmp_path / "sae_weights.safetensors")
    with pytest.raises(ValueError, match="cannot read"):
        SAE.load(tmp_path)


def test_to_casts_every_tensor(tmp_path: Path) -> None:
    write_sae_folder(tmp_path, sae_lens_6_cfg(4, 8, "blocks.0.hook_resid_pre"), random_tensors(4, 8))
    sae = SAE.load(tmp_path).to("cpu", torch.bfloat16)
    assert {tensor.dtype for tensor in sae.tensors().values() if tensor is not None} == {torch.bfloat16}
    assert sae.threshold is None
