"""What the SAE hooks do in one forward pass: per hook point, which deltas to add and what to read.

The engine packs every scheduled token of every request into one sequence of N tokens; "rows" here are
requests, and each table or tap addresses tokens by their index in that packed order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from steering.hook_points import HookPoint
from steering.running_stats import RunningFeatureStats
from steering.sae import SAE


@dataclass(frozen=True)
class SteeringTable:
    """Adds deltas[token_rows[n]] to token n; deltas[0] is zeros, so unsteered tokens get exactly +0."""

    token_rows: torch.Tensor  # [N] long, 0 for tokens of unsteered requests
    deltas: torch.Tensor  # [1 + R, hidden] in the model's dtype, row 0 zeros

    def __post_init__(self) -> None:
        if self.token_rows.dim() != 1 or self.token_rows.dtype != torch.long:
            raise ValueError("SteeringTable.token_rows must be a 1-D long tensor [N]")
        if self.deltas.dim() != 2:
            raise ValueError("SteeringTable.deltas must be a 2-D tensor [1 + R, hidden]")

    def apply(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> [N, hidden], one gather and one add whatever the mix of rows."""
        if hidden.shape[0] != self.token_rows.shape[0]:
            raise ValueError(f"steering table covers {self.token_rows.shape[0]} tokens, the step has {hidden.shape[0]}")
        # A float32 delta would silently promote a bfloat16 residual stream for every later layer.
        if self.deltas.dtype != hidden.dtype:
            raise ValueError(f"steering deltas are {self.deltas.dtype}, the residual stream is {hidden.dtype}")
        return hidden + self.deltas.index_select(0, self.token_rows)


@dataclass(frozen=True)
class MonitorTap:
    """One request's monitor: top-k features of `sae` at some of the step's tokens."""

    key: str  # the engine's request id; results come back under it
    sae: SAE
    positions: torch.Tensor  # [P] long, indices into the step's N tokens
    top_k: int
    features: torch.Tensor | None = None  # [F] long: rank only among these


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

    def __post_init__(self) -> None:
        keys = [tap.key for taps in self.monitors.values() for tap in taps]
        if len(keys) != len(set(keys)):
            raise ValueError("each monitor tap in a step needs its own key")

    @property
    def hook_points(self) -> frozenset[HookPoint]:
        return frozenset(self.steering) | frozenset(self.monitors) | frozenset(self.stats)


def build_steering_table(
    num_tokens: Sequence[int],
    row_deltas: Sequence[torch.Tensor | None],
    device: torch.device | str,
    dtype: torch.dtype,
) -> SteeringTable | None:
    """The table for one hook point from per-request token counts (packed order) and deltas [hidden] (None:
    unsteered); None when no request is steered there, so the hook point can be left out of the plan."""
    if len(num_tokens) != len(row_deltas):
        raise ValueError(f"{len(num_tokens)} token counts for {len(row_deltas)} deltas")
    steered = [delta for delta in row_deltas if delta is not None]
    if not steered:
        return None
    row_ids, next_id = [], 1
    for delta in row_deltas:
        row_ids.append(0 if delta is None else next_id)
        next_id += delta is not None
    counts = torch.tensor(list(num_tokens), dtype=torch.long)
    token_rows = torch.repeat_interleave(torch.tensor(row_ids, dtype=torch.long), counts)  # [N]
    deltas = torch.stack([torch.zeros_like(steered[0]), *steered])  # [1 + R, hidden]
    return SteeringTable(token_rows.to(device), deltas.to(device=device, dtype=dtype))
