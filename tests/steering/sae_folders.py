"""Small SAE folders in SAELens' on-disk layout, written by tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TINY_SAE_ID = "tiny/resid_post_2"  # the SAE scripts/build_tiny_sae.py builds under models/saes


def write_sae_folder(folder: Path, cfg: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """An SAE folder in SAELens' layout: cfg.json plus sae_weights.safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, folder / "sae_weights.safetensors")
    return folder


def random_tensors(d_in: int, d_sae: int, seed: int = 0, threshold: bool = False) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        "W_enc": torch.randn(d_in, d_sae, generator=generator),
        "W_dec": torch.randn(d_sae, d_in, generator=generator),
        "b_enc": torch.randn(d_sae, generator=generator),
        "b_dec": torch.randn(d_in, generator=generator),
    }
    if threshold:
        tensors["threshold"] = torch.rand(d_sae, generator=generator)
    return tensors


def sae_lens_6_cfg(d_in: int, d_sae: int, hook_name: str, architecture: str = "standard", **extra: object) -> dict:
    """cfg.json as SAELens 6 writes it: hook_name and model_name under metadata."""
    return {
        "architecture": architecture,
        "d_in": d_in,
        "d_sae": d_sae,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": {"sae_lens_version": "6.5.1", "model_name": "tiny", "hook_name": hook_name},
        **extra,
    }
