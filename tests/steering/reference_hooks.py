"""Hooks written directly on HF's modules, family by family, that the steering hooks are checked against: which module
holds each SAELens site of a layer (written out here, apart from steering/model_layout.py), and a hook that reads or
edits its input or output."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from steering.hook_points import ATTN_OUT, ATTN_Z, MLP_OUT, RESID_POST, RESID_PRE

POST_NORM_FAMILIES = ("gemma2", "gemma3_text", "olmo2")  # attention and MLP outputs pass a norm before the residual
READ_SITES = (RESID_PRE, ATTN_Z, ATTN_OUT, MLP_OUT, RESID_POST)  # those with one module to hook in HF


def decoder_layer(model: PreTrainedModel, family: str, layer: int) -> nn.Module:
    if family == "gpt2":
        return model.transformer.h[layer]
    if family == "gpt_neox":
        return model.gpt_neox.layers[layer]
    if family == "opt":
        return model.model.decoder.layers[layer]
    return model.model.layers[layer]


def reference_module(model: PreTrainedModel, family: str, layer_index: int, site: str) -> tuple[nn.Module, bool]:
    """The HF module holding `site` of layer `layer_index`, and whether the site is its input (else its output)."""
    layer = decoder_layer(model, family, layer_index)
    if site in (RESID_PRE, RESID_POST):
        return layer, site == RESID_PRE
    if site == ATTN_Z:
        by_family = {"gpt2": "attn.c_proj", "gpt_neox": "attention.dense", "opt": "self_attn.out_proj"}
        owner, name = by_family.get(family, "self_attn.o_proj").split(".")
        return getattr(getattr(layer, owner), name), True
    if family in POST_NORM_FAMILIES:
        return (layer.post_attention_layernorm if site == ATTN_OUT else layer.post_feedforward_layernorm), False
    if site == ATTN_OUT:
        return getattr(layer, {"gpt2": "attn", "gpt_neox": "attention"}.get(family, "self_attn")), False
    return getattr(layer, "fc2" if family == "opt" else "mlp"), False


def reference_hook(module: nn.Module, is_input: bool, edit: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """A hook applying `edit` to the module's input or output tensor (first of a tuple)."""

    def on_input(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (edit(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": edit(kwargs["hidden_states"])}

    def on_output(_: nn.Module, args: tuple, output: Any) -> Any:
        return (edit(output[0]), *output[1:]) if isinstance(output, tuple) else edit(output)

    if is_input:
        return module.register_forward_pre_hook(on_input, with_kwargs=True)
    return module.register_forward_hook(on_output)
