"""What the SAE hooks do in one forward pass: per hook point, which deltas to add and what to read.

The engine packs every scheduled token of every request into one sequence of N tokens; "rows" here are
the requests (chunks) of the step, and each table or tap addresses tokens by their index in that order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from steering.hook_points import HookPoint
from steering.running_stats import RunningFeatureStats
from steering.sae import SAE


@dataclass(frozen=True)
class SteeringTable:
    """Adds deltas[token_rows[n]] to token n; an unsteered row's delta is zeros, so its tokens get exactly +0."""

    token_rows: torch.Tensor  # [N] long: the row (request) of each packed token
    deltas: torch.Tensor  # [R, width] in the model's dtype: the hook point's width

    def __post_init__(self) -> None:
        if self.token_rows.dim() != 1 or self.token_rows.dtype != torch.long:
            raise ValueError("SteeringTable.token_rows must be a 1-D long tensor [N]")
        if self.deltas.dim() != 2:
            raise ValueError("SteeringTable.deltas must be a 2-D tensor [R, width]")

    def apply(self, hidden: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """hidden [N, width] -> [N, width] plus each token's delta times `scale`, one gather and one add whatever the
        mix of rows."""
        if hidden.shape[0] != self.token_rows.shape[0]:
            raise ValueError(f"steering table covers {self.token_rows.shape[0]} tokens, the step has {hidden.shape[0]}")
        # A float32 delta would silently promote a bfloat16 residual stream for every later layer.
        if self.deltas.dtype != hidden.dtype:
            raise ValueError(f"steering deltas are {self.deltas.dtype}, the residual stream is {hidden.dtype}")
        deltas = self.deltas.index_select(0, self.token_rows)  # [N, width]
        return hidden + deltas if scale == 1.0 else hidden + deltas * scale


@dataclass(frozen=True)
class MonitorTap:
    """One request's monitor: top-k features of `sae` at some of the step's tokens."""

    key: str  # the engine's request id; results come back under it
    sae: SAE
    positions: torch.Tensor  # [P] long, indices into the step's N tokens
    top_k: int
    features: torch.Tensor | None = None  # [F] long: rank only among these

    def __post_init__(self) -> None:
        if self.positions.dim() != 1 or self.positions.dtype != torch.long:
            raise ValueError(f"monitor {self.key}: positions must be a 1-D long tensor [P]")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k <= 0:
            raise ValueError(f"monitor {self.key}: top_k must be a positive integer, got {self.top_k!r}")


@dataclass(frozen=True)
class MonitorResult:
    values: torch.Tensor  # [P, k] descending, on the model's device
    indices: torch.Tensor  # [P, k] long feature indices into d_sae


@dataclass(frozen=True)
class StatsTap:
    """The worker-wide monitor: the chosen features' activations at `positions` (None: every token)."""

    sae: SAE
    stats: RunningFeatureStats
    positions: torch.Tensor | None = None  # [P] long


@dataclass(frozen=True)
class StepPlan:
    steering: Mapping[HookPoint, SteeringTable] = field(default_factory=dict)
    monitors: Mapping[HookPoint, Sequence[MonitorTap]] = field(default_factory=dict)
    stats: Mapping[HookPoint, Sequence[StatsTap]] = field(default_factory=dict)
    # The residual at the point (after its steering) copied into this [N, width] buffer: a CUDA graph records the
    # copy, and the monitors read the buffer after each replay (worker/engine/graphs/graph_hooks.py).
    captures: Mapping[HookPoint, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        keys = [tap.key for taps in self.monitors.values() for tap in taps]
        if len(keys) != len(set(keys)):
            raise ValueError("each monitor tap in a step needs its own key")

    @cached_property  # every hook asks on every forward pass
    def hook_points(self) -> frozenset[HookPoint]:
        return frozenset(self.steering) | frozenset(self.monitors) | frozenset(self.stats) | frozenset(self.captures)


def build_steering_table(
    token_rows: torch.Tensor, row_deltas: Sequence[torch.Tensor | None], dtype: torch.dtype
) -> SteeringTable | None:
    """The table for one hook point: token_rows [N] gives each packed token's row (request), as the engine's
    step already has it; row_deltas gives each row's [width] delta, or None when the row is unsteered.

    None when no row is steered there, so the hook point can be left out of the plan.
    """
    steered = [delta for delta in row_deltas if delta is not None]
    if not steered:
        return None
    zeros = torch.zeros_like(steered[0])
    deltas = torch.stack([zeros if delta is None else delta for delta in row_deltas])  # [R, width]
    return SteeringTable(token_rows, deltas.to(device=token_rows.device, dtype=dtype))
