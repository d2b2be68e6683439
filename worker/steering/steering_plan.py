"""The SAE hooks' plan for one engine step, from the scheduled chunks and their requests' resolved steering and
monitors, and the monitored positions read back from the hooks' results.

Chunk i of the batch is row i; its tokens sit at packed indices [offset_i, offset_i + num_tokens_i).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from scheduler.batch import ScheduledChunk
from steering.hook_points import HookPoint
from steering.step_plan import MonitorResult, MonitorTap, SteeringTable, StepPlan, build_steering_table
from tasks.messages.steering import MonitoredPosition
from worker.engine.transfers import to_host
from worker.steering.request_sae import RequestSAE
from worker.steering.worker_monitor import WorkerMonitor


@dataclass(frozen=True)
class MonitorSlice:
    """Which sequence positions (and tokens) one request's monitor tap reads this step, in the tap's order."""

    request_id: str
    positions: list[int]
    token_ids: list[int]


def build_step_plan(
    chunks: Sequence[ScheduledChunk],
    token_rows: torch.Tensor,  # [N] long: each packed token's row
    rows: Sequence[RequestSAE | None],  # one per chunk
    worker_monitor: WorkerMonitor | None,
    dtype: torch.dtype,
) -> tuple[StepPlan | None, list[MonitorSlice]]:
    """None when no row steers or monitors and no worker-wide monitor runs: the hooks then do nothing."""
    steering = steering_tables(token_rows, rows, dtype)
    monitors, slices = monitor_taps(chunks, rows, token_rows.device)
    stats_taps = {} if worker_monitor is None else {worker_monitor.point: [worker_monitor.tap]}
    if not (steering or monitors or stats_taps):
        return None, []
    return StepPlan(steering=steering, monitors=monitors, stats=stats_taps), slices


def steering_tables(
    token_rows: torch.Tensor, rows: Sequence[RequestSAE | None], dtype: torch.dtype
) -> dict[HookPoint, SteeringTable]:
    points = {point for row in rows if row is not None for point in row.deltas}
    tables = {}
    for point in sorted(points):
        deltas = [None if row is None else row.deltas.get(point) for row in rows]
        tables[point] = build_steering_table(token_rows, deltas, dtype)
    return tables


def monitor_taps(
    chunks: Sequence[ScheduledChunk], rows: Sequence[RequestSAE | None], device: torch.device
) -> tuple[dict[HookPoint, list[MonitorTap]], list[MonitorSlice]]:
    taps: dict[HookPoint, list[MonitorTap]] = {}
    slices = []
    offset = 0
    for chunk, row in zip(chunks, rows, strict=True):
        monitor = None if row is None else row.monitor
        positions = [] if monitor is None else monitor.take_positions(chunk)
        if positions:
            request_id = chunk.request.request_id
            packed = torch.tensor([offset + p - chunk.start for p in positions], dtype=torch.long)
            packed = packed.to(device, non_blocking=True)
            tap = MonitorTap(request_id, monitor.sae, packed, monitor.spec.top_k, monitor.features)
            taps.setdefault(monitor.point, []).append(tap)
            token_ids = chunk.request.token_ids(positions[0], positions[-1] + 1)
            slices.append(MonitorSlice(request_id, positions, token_ids))
        offset += chunk.num_tokens
    return taps, slices


def read_monitored(results: dict[str, MonitorResult], slices: list[MonitorSlice]) -> dict[str, list[MonitoredPosition]]:
    """Each request's monitored positions, every tap's read back to the host in one transfer."""
    if not slices:
        return {}
    tensors = [
        tensor for piece in slices for tensor in (results[piece.request_id].values, results[piece.request_id].indices)
    ]
    host = iter(to_host(*tensors))
    monitored = {}
    for piece in slices:
        values, indices = next(host).tolist(), next(host).tolist()  # [P, k] each
        monitored[piece.request_id] = [
            MonitoredPosition(position, token_id, tuple(zip(row_indices, row_values, strict=True)))
            for position, token_id, row_values, row_indices in zip(
                piece.positions, piece.token_ids, values, indices, strict=True
            )
        ]
    return monitored
