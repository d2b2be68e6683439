"""Forward hooks on the decoder layers that carry out one StepPlan per forward pass, for the whole batch.

Installed once per hook point and left in place; without a plan each hook returns at its first line.
Steering is one gather and one add per hook point, so steered and unsteered requests share the pass.
At a point that both steers and monitors, monitors read the residual after steering: what the rest of
the model sees.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from steering.hook_points import HookPoint, decoder_layers
from steering.sae_math import encode, top_k_activations
from steering.step_plan import MonitorResult, MonitorTap, StatsTap, StepPlan


class BatchHooks:
    """Call from the engine thread: set_step(plan) → model forward → take_monitor_results() → clear()."""

    def __init__(self, model: nn.Module) -> None:
        self._layers = decoder_layers(model)
        self._handles: dict[HookPoint, RemovableHandle] = {}
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
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()
        self._plan = None

    @property
    def installed(self) -> frozenset[HookPoint]:
        return frozenset(self._handles)

    def _install(self, point: HookPoint) -> None:
        if point in self._handles:
            return
        if point.layer >= len(self._layers):
            raise ValueError(f"hook point {point.hook_name} is past the model's {len(self._layers)} layers")
        layer = self._layers[point.layer]
        if point.position == "pre":
            handle = layer.register_forward_pre_hook(partial(self._on_layer_input, point), with_kwargs=True)
        else:
            handle = layer.register_forward_hook(partial(self._on_layer_output, point))
        self._handles[point] = handle

    def _on_layer_input(
        self, point: HookPoint, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if self._plan is None or point not in self._plan.hook_points:
            return None
        if args:
            return (self._apply(point, args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": self._apply(point, kwargs["hidden_states"])}

    def _on_layer_output(self, point: HookPoint, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        if self._plan is None or point not in self._plan.hook_points:
            return None
        # Decoder layers return the hidden states alone (transformers 5) or first in a tuple (earlier).
        if isinstance(output, tuple):
            return (self._apply(point, output[0]), *output[1:])
        return self._apply(point, output)

    def _apply(self, point: HookPoint, hidden: torch.Tensor) -> torch.Tensor:
        plan = self._plan
        flat = hidden.reshape(-1, hidden.shape[-1])  # [N, hidden]: packed [1, N, .] or padded [B, T, .]
        table = plan.steering.get(point)
        if table is not None:
            flat = table.apply(flat)
        captured = plan.captures.get(point)
        if captured is not None:
            captured.copy_(flat)
        if plan.monitors.get(point):
            self._results.update(read_monitors(plan.monitors[point], flat))
        for tap in plan.stats.get(point, ()):
            read_stats(tap, flat)
        return hidden if table is None else flat.view(hidden.shape)


def read_monitors(taps: Sequence[MonitorTap], hidden: torch.Tensor) -> dict[str, MonitorResult]:
    """Top-k features per tap from hidden [N, hidden]; taps sharing an SAE are encoded in one matmul."""
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
