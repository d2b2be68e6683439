"""Where an SAE attaches: SAELens hook names mapped onto an HF model's decoder layers.

`blocks.{L}.hook_resid_pre` is the residual stream entering decoder layer L (its input);
`blocks.{L}.hook_resid_post` is the residual leaving it (its output, before any final norm).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from torch import nn

from steering.sae_config import SAEConfig

HOOK_NAME_PATTERN = re.compile(r"blocks\.(\d+)\.hook_resid_(pre|post)")


@dataclass(frozen=True, order=True)
class HookPoint:
    layer: int
    position: Literal["pre", "post"]

    def __post_init__(self) -> None:
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise ValueError(f"hook point layer must be a non-negative integer, got {self.layer!r}")
        if self.position not in ("pre", "post"):
            raise ValueError(f"hook point position must be 'pre' or 'post', got {self.position!r}")

    @property
    def hook_name(self) -> str:
        return f"blocks.{self.layer}.hook_resid_{self.position}"


def parse_hook_name(hook_name: str) -> HookPoint:
    match = HOOK_NAME_PATTERN.fullmatch(hook_name) if isinstance(hook_name, str) else None
    if match is None:
        raise ValueError(
            f"hook_name {hook_name!r} is not supported: only residual-stream SAEs, "
            "'blocks.{L}.hook_resid_pre' or 'blocks.{L}.hook_resid_post'"
        )
    return HookPoint(int(match.group(1)), match.group(2))  # type: ignore[arg-type]


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM that keeps them at `model.model.layers` (Llama, Mistral, Qwen, Gemma)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(
            f"{type(model).__name__} keeps no decoder layers at model.model.layers; "
            "SAE hooks support Llama-style causal LMs (Llama, Mistral, Qwen2/3, Gemma)"
        )
    return layers


def hidden_size(model: nn.Module) -> int:
    config = model.config
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text_config.hidden_size)


def check_sae_fits(model: nn.Module, config: SAEConfig) -> HookPoint:
    """The SAE's hook point on this model; raises ValueError if the layer or d_in does not match it."""
    point = parse_hook_name(config.hook_name)
    num_layers = len(decoder_layers(model))
    if point.layer >= num_layers:
        raise ValueError(f"SAE hook {config.hook_name!r} names layer {point.layer}; the model has {num_layers} layers")
    size = hidden_size(model)
    if config.d_in != size:
        raise ValueError(f"SAE d_in {config.d_in} does not match the model's hidden size {size}")
    return point
