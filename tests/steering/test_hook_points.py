"""steering/hook_points.py: SAELens hook names onto the HF decoder layers, and fit checks."""

from __future__ import annotations

import pytest
from torch import nn
from transformers import PreTrainedModel

from steering.hook_points import HookPoint, check_sae_fits, decoder_layers, parse_hook_name
from steering.sae_config import SAEConfig


def test_parses_resid_pre_and_post() -> None:
    assert parse_hook_name("blocks.0.hook_resid_pre") == HookPoint(0, "pre")
    assert parse_hook_name("blocks.12.hook_resid_post") == HookPoint(12, "post")
    assert HookPoint(12, "post").hook_name == "blocks.12.hook_resid_post"


@pytest.mark.parametrize(
    "hook_name",
    [
        "blocks.3.hook_mlp_out",
        "blocks.3.attn.hook_z",
        "hook_embed",
        "blocks.x.hook_resid_pre",
        "blocks.3.hook_resid_mid",
        "blocks.3.hook_resid_post.extra",
        " blocks.3.hook_resid_post",
    ],
)
def test_refuses_other_hook_names(hook_name: str) -> None:
    with pytest.raises(ValueError, match="only residual-stream SAEs"):
        parse_hook_name(hook_name)


def test_finds_the_tiny_models_layers(tiny_model: PreTrainedModel) -> None:
    assert decoder_layers(tiny_model) is tiny_model.model.layers


def test_refuses_models_without_decoder_layers() -> None:
    with pytest.raises(ValueError, match=r"Linear keeps no decoder layers at model\.model\.layers"):
        decoder_layers(nn.Linear(2, 2))


def test_check_sae_fits(tiny_model: PreTrainedModel) -> None:
    assert check_sae_fits(tiny_model, SAEConfig(128, 512, "blocks.3.hook_resid_post")) == HookPoint(3, "post")
    with pytest.raises(ValueError, match="SAE d_in 64 does not match the model's hidden size 128"):
        check_sae_fits(tiny_model, SAEConfig(64, 512, "blocks.2.hook_resid_post"))
    with pytest.raises(ValueError, match="names layer 4; the model has 4 layers"):
        check_sae_fits(tiny_model, SAEConfig(128, 512, "blocks.4.hook_resid_pre"))
