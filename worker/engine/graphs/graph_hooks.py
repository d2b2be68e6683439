"""Steering and monitoring inside captured decode graphs, without a Python branch on which rows steer.

A graph records the SAE hooks' arithmetic once, at capture, so what varies per step must be data: at each hook point
the graphs cover, the graph adds a static per-row delta buffer [max_rows, width] to the activations there (a steered
row's delta, zeros for unsteered and padding rows), and copies them into a static buffer that the monitors read
after the replay. The points covered only grow: a step that steers or monitors somewhere new adds the point, and
the graphs are captured again with it (DecodeGraphs drops them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from steering.batch_hooks import read_monitors, read_stats
from steering.hook_points import HookPoint
from steering.step_plan import MonitorResult, SteeringTable, StepPlan


@dataclass(frozen=True)
class HookSet:
    """The hook points a graph adds deltas at, and those whose residual it copies out."""

    steered: frozenset[HookPoint] = frozenset()
    read: frozenset[HookPoint] = frozenset()

    @classmethod
    def of(cls, plan: StepPlan | None) -> HookSet:
        if plan is None:
            return cls()
        return cls(frozenset(plan.steering), frozenset(plan.monitors) | frozenset(plan.stats))

    def covers(self, other: HookSet) -> bool:
        return other.steered <= self.steered and other.read <= self.read

    def union(self, other: HookSet) -> HookSet:
        return HookSet(self.steered | other.steered, self.read | other.read)


class GraphHookBuffers:
    """The static delta and residual buffers of the hook points in `hooks`, for up to `max_rows` rows, each as wide
    as `point_width` says its point is."""

    def __init__(
        self, point_width: Callable[[HookPoint], int], max_rows: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self._point_width = point_width
        self._max_rows = max_rows
        self._dtype, self._device = dtype, device
        self._rows = torch.arange(max_rows, device=device)  # [max_rows]: decode row i is packed token i
        self.hooks = HookSet()
        self._deltas: dict[HookPoint, torch.Tensor] = {}  # [max_rows, width], zero outside steered rows
        self._residuals: dict[HookPoint, torch.Tensor] = {}  # [max_rows, width], written by each replay
        self._nonzero: set[HookPoint] = set()  # delta buffers holding a steered row since they were last zeroed

    def extend(self, hooks: HookSet) -> None:
        """Covers `hooks` too, from the next capture on."""
        self.hooks = self.hooks.union(hooks)
        for point in self.hooks.steered - self._deltas.keys():
            self._deltas[point] = self._zeros(point)
        for point in self.hooks.read - self._residuals.keys():
            self._residuals[point] = self._zeros(point)

    def _zeros(self, point: HookPoint) -> torch.Tensor:
        shape = (self._max_rows, self._point_width(point))
        return torch.zeros(shape, dtype=self._dtype, device=self._device)

    def capture_plan(self, bucket: int) -> StepPlan | None:
        """What the hooks record into a graph of `bucket` rows: an add of each delta buffer, a copy into each
        residual buffer; None when the graphs cover no point."""
        if not (self._deltas or self._residuals):
            return None
        rows = self._rows[:bucket]
        steering = {point: SteeringTable(rows, deltas[:bucket]) for point, deltas in self._deltas.items()}
        captures = {point: residual[:bucket] for point, residual in self._residuals.items()}
        return StepPlan(steering=steering, captures=captures)

    def load(self, plan: StepPlan | None, num_rows: int) -> None:
        """Each covered point's deltas for this step's `num_rows` rows (`plan` being what eager hooks would run),
        zeros past them; a buffer already all zeros is left alone."""
        steering = {} if plan is None else plan.steering
        for point, deltas in self._deltas.items():
            table = steering.get(point)
            if table is None:
                if point in self._nonzero:
                    deltas.zero_()
                    self._nonzero.discard(point)
                continue
            deltas[:num_rows].copy_(table.deltas.index_select(0, table.token_rows))  # [num_rows, width]
            deltas[num_rows:].zero_()
            self._nonzero.add(point)

    def read(self, plan: StepPlan | None, num_rows: int) -> dict[str, MonitorResult]:
        """What the plan's monitors and worker-wide stats read, from the residuals the replay left: the same math
        as the eager hooks, over the same values."""
        if plan is None:
            return {}
        results: dict[str, MonitorResult] = {}
        for point, taps in plan.monitors.items():
            results.update(read_monitors(taps, self._residuals[point][:num_rows]))
        for point, taps in plan.stats.items():
            for tap in taps:
                read_stats(tap, self._residuals[point][:num_rows])
        return results
