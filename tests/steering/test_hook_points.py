"""steering/hook_points.py and model_layout.py: SAELens hook names, each family's layout, and fit checks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from torch import nn
from transformers import PreTrainedModel

from steering.hook_points import (
    ATTN_OUT,
    ATTN_Z,
    MLP_OUT,
    RESID_MID,
    RESID_POST,
    RESID_PRE,
    SITES,
    HookPoint,
    check_sae_fits,
    parse_hook_name,
    sites_of,
)
from steering.model_layout import ModelLayout
from steering.sae_config import SAEConfig
from tests.worker.family_configs import FAMILIES, build_family_model


@pytest.mark.parametrize(
    ("hook_name", "point"),
    [
        ("blocks.0.hook_resid_pre", HookPoint(0, RESID_PRE)),
        ("blocks.12.hook_resid_post", HookPoint(12, RESID_POST)),
        ("blocks.3.hook_resid_mid", HookPoint(3, RESID_MID)),
        ("blocks.3.hook_attn_out", HookPoint(3, ATTN_OUT)),
        ("blocks.3.hook_mlp_out", HookPoint(3, MLP_OUT)),
        ("blocks.3.attn.hook_z", HookPoint(3, ATTN_Z)),
    ],
)
def test_parses_every_site(hook_name: str, point: HookPoint) -> None:
    assert parse_hook_name(hook_name) == point
    assert point.hook_name == hook_name


@pytest.mark.parametrize(
    "hook_name",
    [
        "hook_embed",
        "blocks.x.hook_resid_pre",
        "blocks.3.attn.hook_q",
        "blocks.3.hook_resid_post.extra",
        " blocks.3.hook_resid_post",
        "blocks.3.attnxhook_z",
    ],
)
def test_refuses_other_hook_names(hook_name: str) -> None:
    with pytest.raises(ValueError, match="SAEs attach at 'blocks"):
        parse_hook_name(hook_name)


def test_refuses_unknown_sites() -> None:
    with pytest.raises(ValueError, match="hook point site must be one of"):
        HookPoint(0, "post")


def test_finds_the_tiny_models_layers(tiny_model: PreTrainedModel) -> None:
    layout = ModelLayout.of(tiny_model)
    assert layout.layers is tiny_model.model.layers
    assert (layout.hidden_size, layout.heads_width()) == (128, 4 * 32)


@pytest.mark.parametrize(
    ("family", "layers_of"),
    [
        ("gpt2", lambda model: model.transformer.h),
        ("gpt_neox", lambda model: model.gpt_neox.layers),
        ("opt", lambda model: model.model.decoder.layers),
    ],
)
def test_finds_the_layers_of_families_not_shaped_like_llama(
    family: str, layers_of: Callable[[PreTrainedModel], nn.ModuleList]
) -> None:
    model = build_family_model(family)
    assert ModelLayout.of(model).layers is layers_of(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_every_site_but_resid_mid_where_the_residual_is_parallel(family: str) -> None:
    sites = sites_of(ModelLayout.of(build_family_model(family)))
    assert sites == (tuple(site for site in SITES if site != RESID_MID) if family == "gpt_neox" else SITES)


def test_a_post_norm_opt_and_a_sequential_neox_say_which_have_resid_mid() -> None:
    assert RESID_MID not in sites_of(ModelLayout.of(build_family_model("opt", do_layer_norm_before=False)))
    assert RESID_MID in sites_of(ModelLayout.of(build_family_model("gpt_neox", use_parallel_residual=False)))


def test_refuses_an_unknown_family() -> None:
    model = build_family_model("llama")
    model.config.model_type = "t5"
    with pytest.raises(ValueError, match="model_type 't5' is not a family the engine knows"):
        ModelLayout.of(model)


def test_check_sae_fits(tiny_model: PreTrainedModel) -> None:
    layout = ModelLayout.of(tiny_model)
    assert check_sae_fits(layout, SAEConfig(128, 512, "blocks.3.hook_resid_post")) == HookPoint(3, RESID_POST)
    assert check_sae_fits(layout, SAEConfig(128, 512, "blocks.1.attn.hook_z")) == HookPoint(1, ATTN_Z)
    with pytest.raises(ValueError, match="SAE d_in 64 does not match the model's width 128 at hook_resid_post"):
        check_sae_fits(layout, SAEConfig(64, 512, "blocks.2.hook_resid_post"))
    with pytest.raises(ValueError, match="names layer 4; the model has 4 layers"):
        check_sae_fits(layout, SAEConfig(128, 512, "blocks.4.hook_resid_pre"))


def test_hook_z_is_as_wide_as_the_heads_where_that_is_not_the_hidden_size() -> None:
    layout = ModelLayout.of(build_family_model("gemma", head_dim=32))  # 4 heads of 32 on a hidden size of 64
    assert check_sae_fits(layout, SAEConfig(128, 512, "blocks.0.attn.hook_z")) == HookPoint(0, ATTN_Z)
    with pytest.raises(ValueError, match=r"width 128 at attn\.hook_z"):
        check_sae_fits(layout, SAEConfig(64, 512, "blocks.0.attn.hook_z"))


def test_resid_mid_is_refused_where_the_model_has_none() -> None:
    layout = ModelLayout.of(build_family_model("gpt_neox"))
    with pytest.raises(ValueError, match="this model's layers have no hook_resid_mid"):
        check_sae_fits(layout, SAEConfig(64, 512, "blocks.0.hook_resid_mid"))
