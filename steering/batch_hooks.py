"""Forward hooks on the model's modules that carry out one StepPlan per forward pass, for the whole batch.

Installed once per hook point and left in place; without a plan each hook returns at its first line.
Steering is one gather and one add per hook point, so steered and unsteered requests share the pass.
At a point that both steers and monitors, monitors read the residual after steering: what the rest of
the model sees.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from steering.hook_points import ATTN_OUT, ATTN_Z, MLP_OUT, RESID_POST, RESID_PRE, HookPoint, sites_of
from steering.model_layout import ModelLayout
from steering.sae_math import encode, top_k_activations
from steering.step_plan import MonitorResult, MonitorTap, StatsTap, StepPlan


class Role(Enum):
    """What a hook does at its point: most points are steered and read at one module, resid_mid at two."""

    BOTH = "both"
    STEER = "steer"
    READ = "read"


@dataclass(frozen=True)
class HookSite:
    """One forward hook of a hook point: on `module`'s input (a pre-hook) or on its output."""

    module: nn.Module
    is_input: bool
    role: Role = Role.BOTH
    is_first: bool = False  # run before the module's other output hooks
    delta_scale: float = 1.0  # what the steering deltas are multiplied by here


def hook_sites(layout: ModelLayout, point: HookPoint) -> list[HookSite]:
    """Where `point` is hooked on this model; raises ValueError for a point the model does not have."""
    if point.layer >= layout.num_layers:
        raise ValueError(f"hook point {point.hook_name} is past the model's {layout.num_layers} layers")
    if point.site not in sites_of(layout):
        raise ValueError(f"hook point {point.hook_name}: this model's layers have no {point.site}")
    family, layer = layout.family, point.layer
    if point.site == RESID_PRE:
        return [HookSite(layout.layers[layer], is_input=True)]
    if point.site == RESID_POST:
        return [HookSite(layout.layers[layer], is_input=False)]
    if point.site == ATTN_Z:
        return [HookSite(layout.module(layer, family.attention_projection), is_input=True)]
    if point.site == MLP_OUT:
        return [HookSite(layout.module(layer, family.mlp_out), is_input=False)]
    attention_out = layout.module(layer, family.attention_out)
    if point.site == ATTN_OUT:  # first, so that it reads attention's output before resid_mid's steering adds to it
        return [HookSite(attention_out, is_input=False, is_first=True)]
    # No module holds the residual between attention and MLP: it is steered by adding to what attention adds to it
    # (which Granite scales before adding), and read where the MLP's branch takes it in.
    return [
        HookSite(attention_out, is_input=False, role=Role.STEER, delta_scale=1.0 / layout.residual_multiplier),
        HookSite(layout.module(layer, family.mlp_input), is_input=True, role=Role.READ),
    ]


class BatchHooks:
    """Call from the engine thread: set_step(plan) → model forward → take_monitor_results() → clear()."""

    def __init__(self, layout: ModelLayout) -> None:
        self.layout = layout
        self._handles: dict[HookPoint, list[RemovableHandle]] = {}
        self._plan: StepPlan | None = None
        self._results: dict[str, MonitorResult] = {}

    def set_step(self, plan: StepPlan) -> None:
        for point in plan.hook_points:
            self._install(point)
        self._plan = plan
        self._results = {}

    def take_monitor_results(self) -> dict[str, MonitorResult]:
        """The monitor taps' results of the last forward pass, by tap key; tensors stay on the device."""
        results, self._results = self._results, {}
        return results

    def clear(self) -> None:
        self._plan = None

    def close(self) -> None:
        for handles in self._handles.values():
            for handle in handles:
                handle.remove()
        self._handles.clear()
        self._plan = None

    @property
    def installed(self) -> frozenset[HookPoint]:
        return frozenset(self._handles)

    def _install(self, point: HookPoint) -> None:
        if point in self._handles:
            return
        self._handles[point] = [self._register(point, site) for site in hook_sites(self.layout, point)]

    def _register(self, point: HookPoint, site: HookSite) -> RemovableHandle:
        if site.is_input:
            return site.module.register_forward_pre_hook(partial(self._on_input, point, site), with_kwargs=True)
        return site.module.register_forward_hook(partial(self._on_output, point, site), prepend=site.is_first)

    def _on_input(
        self, point: HookPoint, site: HookSite, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if self._plan is None or point not in self._plan.hook_points:
            return None
        if args:
            return (self._apply(point, site, args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": self._apply(point, site, kwargs["hidden_states"])}

    def _on_output(
        self, point: HookPoint, site: HookSite, module: nn.Module, args: tuple[Any, ...], output: Any
    ) -> Any:
        if self._plan is None or point not in self._plan.hook_points:
            return None
        # Layers return the hidden states alone (transformers 5) or first in a tuple (earlier); attention modules
        # return (output, weights) and gpt-oss's MoE (output, router scores).
        if isinstance(output, tuple):
            return (self._apply(point, site, output[0]), *output[1:])
        return self._apply(point, site, output)

    def _apply(self, point: HookPoint, site: HookSite, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])  # [N, width]: packed [1, N, .] or padded [B, T, .]
        table = self._plan.steering.get(point) if site.role is not Role.READ else None
        if table is not None:
            flat = table.apply(flat, site.delta_scale)
        if site.role is not Role.STEER:
            self._read(point, flat)
        return hidden if table is None else flat.view(hidden.shape)

    def _read(self, point: HookPoint, flat: torch.Tensor) -> None:
        plan = self._plan
        captured = plan.captures.get(point)
        if captured is not None:
            captured.copy_(flat)
        if plan.monitors.get(point):
            self._results.update(read_monitors(plan.monitors[point], flat))
        for tap in plan.stats.get(point, ()):
            read_stats(tap, flat)


def read_monitors(taps: Sequence[MonitorTap], hidden: torch.Tensor) -> dict[str, MonitorResult]:
    """Top-k features per tap from hidden [N, width]; taps sharing an SAE are encoded in one matmul."""
    by_sae: dict[int, list[MonitorTap]] = defaultdict(list)
    for tap in taps:
        by_sae[id(tap.sae)].append(tap)
    results = {}
    for group in by_sae.values():
        positions = torch.cat([tap.positions for tap in group])  # [P_total]
        acts = encode(group[0].sae, hidden.index_select(0, positions))  # [P_total, d_sae]
        for tap, tap_acts in zip(group, acts.split([tap.positions.numel() for tap in group]), strict=True):
            values, indices = top_k_activations(tap_acts, tap.top_k, tap.features)
            results[tap.key] = MonitorResult(values, indices)
    return results


def read_stats(tap: StatsTap, hidden: torch.Tensor) -> None:
    tokens = hidden if tap.positions is None else hidden.index_select(0, tap.positions)
    tap.stats.update(encode(tap.sae, tokens, tap.stats.features))  # [P, F]
