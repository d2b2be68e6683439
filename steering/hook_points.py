"""Where an SAE attaches: SAELens hook names, `blocks.{L}.{site}`, and whether one fits a model.

Sites, on decoder layer L (steering/model_layout.py says which HF module each one is in every family):
`hook_resid_pre` the residual entering the layer; `hook_resid_mid` the residual between attention and MLP;
`hook_resid_post` the residual leaving the layer (before any final norm); `hook_attn_out` and `hook_mlp_out` what
attention and the MLP add to the residual; `attn.hook_z` the heads' outputs before the output projection, flattened to
[n_heads * d_head] as SAELens does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from steering.model_layout import ModelLayout
from steering.sae_config import SAEConfig

RESID_PRE = "hook_resid_pre"
RESID_MID = "hook_resid_mid"
RESID_POST = "hook_resid_post"
ATTN_OUT = "hook_attn_out"
MLP_OUT = "hook_mlp_out"
ATTN_Z = "attn.hook_z"
SITES = (RESID_PRE, RESID_MID, RESID_POST, ATTN_OUT, MLP_OUT, ATTN_Z)
HOOK_NAME_PATTERN = re.compile(r"blocks\.(\d+)\.(" + "|".join(re.escape(site) for site in SITES) + ")")


@dataclass(frozen=True, order=True)
class HookPoint:
    layer: int
    site: str  # one of SITES

    def __post_init__(self) -> None:
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise ValueError(f"hook point layer must be a non-negative integer, got {self.layer!r}")
        if self.site not in SITES:
            raise ValueError(f"hook point site must be one of {', '.join(SITES)}, got {self.site!r}")

    @property
    def hook_name(self) -> str:
        return f"blocks.{self.layer}.{self.site}"


def parse_hook_name(hook_name: str) -> HookPoint:
    match = HOOK_NAME_PATTERN.fullmatch(hook_name) if isinstance(hook_name, str) else None
    if match is None:
        raise ValueError(
            f"hook_name {hook_name!r} is not supported: SAEs attach at 'blocks.{{L}}.<site>' with <site> one of "
            f"{', '.join(SITES)}"
        )
    return HookPoint(int(match.group(1)), match.group(2))


def sites_of(layout: ModelLayout) -> tuple[str, ...]:
    """The sites this model's layers have: all but hook_resid_mid where attention and MLP share a residual."""
    return tuple(site for site in SITES if site != RESID_MID or layout.has_resid_mid)


def point_width(layout: ModelLayout, point: HookPoint) -> int:
    """The width of the activations at `point`: the residual's, or n_heads * d_head at attn.hook_z."""
    return layout.heads_width() if point.site == ATTN_Z else layout.hidden_size


def check_sae_fits(layout: ModelLayout, config: SAEConfig) -> HookPoint:
    """The SAE's hook point on this model; raises ValueError if the model has no such point or d_in is not its
    width."""
    point = parse_hook_name(config.hook_name)
    if point.layer >= layout.num_layers:
        raise ValueError(
            f"SAE hook {config.hook_name!r} names layer {point.layer}; the model has {layout.num_layers} layers"
        )
    if point.site not in sites_of(layout):
        raise ValueError(f"SAE hook {config.hook_name!r}: this model's layers have no {point.site}")
    width = point_width(layout, point)
    if config.d_in != width:
        raise ValueError(f"SAE d_in {config.d_in} does not match the model's width {width} at {point.site}")
    return point
