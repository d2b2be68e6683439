"""One request's steering and monitor, resolved once when it is submitted: per-hook-point deltas on the device and
the SAE to monitor with, so that every step only gathers them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch

from scheduler.batch import ScheduledChunk
from steering.hook_points import HookPoint
from steering.sae import SAE
from steering.sae_math import steering_direction
from tasks.config import Config
from tasks.messages.steering import MonitorPositions, MonitorSpec, SteeringSpec
from worker.engine.interface import EngineRequest, RequestFieldError
from worker.steering.sae_attachments import SAEAttachments


@dataclass
class RequestMonitor:
    """Engine thread only: `next_position` moves on as positions are read, so a preempted request that recomputes
    its tokens does not report them twice."""

    spec: MonitorSpec
    sae: SAE
    point: HookPoint
    features: torch.Tensor | None  # [F] long on the device
    num_prompt_tokens: int
    next_position: int = 0

    def take_positions(self, chunk: ScheduledChunk) -> list[int]:
        """The sequence positions of `chunk` to read this step, in order."""
        positions = self.spec.positions
        if positions is MonitorPositions.LAST:
            start, end = chunk.end - 1 if chunk.is_sampling else chunk.end, chunk.end
        elif positions is MonitorPositions.PROMPT:
            start, end = chunk.start, min(chunk.end, self.num_prompt_tokens)
        elif positions is MonitorPositions.COMPLETION:
            start, end = max(chunk.start, self.num_prompt_tokens), chunk.end
        else:
            start, end = chunk.start, chunk.end
        start = max(start, self.next_position)
        if start >= end:
            return []
        self.next_position = end
        return list(range(start, end))


@dataclass(frozen=True)
class RequestSAE:
    applied: SteeringSpec | None  # the steering as it runs (strengths clamped); None when the request named none
    deltas: Mapping[HookPoint, torch.Tensor]  # [hidden] in the model's dtype, on its device
    monitor: RequestMonitor | None

    @property
    def steering_key(self) -> str:
        return "" if self.applied is None else self.applied.key

    @property
    def reads_prompt(self) -> bool:
        """A monitor of prompt positions needs them computed, not served by the prefix cache."""
        positions = None if self.monitor is None else self.monitor.spec.positions
        return positions in (MonitorPositions.PROMPT, MonitorPositions.ALL)


def resolve_request_sae(request: EngineRequest, attachments: SAEAttachments, config: Config) -> RequestSAE | None:
    """None for a request with neither steering nor monitor; raises RequestFieldError for what cannot run (a
    vector file that does not exist, an SAE that does not fit), naming the field at fault as closely as it can."""
    if request.steering is None and request.monitor is None:
        return None
    applied, deltas = None, {}
    if request.steering is not None:
        steering = resolve_steering(request.steering, attachments, config)
        applied, deltas = steering.applied, steering.deltas
    monitor = None
    if request.monitor is not None:
        monitor = in_field("monitor", resolve_monitor, request, attachments, config)
    return RequestSAE(applied, deltas, monitor)


T = TypeVar("T")


def in_field(param: str, resolve: Callable[..., T], *args: object) -> T:
    """`resolve(*args)`, whose ValueError (SAELookupError included) is the request's error in field `param`."""
    try:
        return resolve(*args)
    except ValueError as exc:
        raise RequestFieldError(f"steering or monitor: {exc}", param) from None


def resolve_steering(spec: SteeringSpec, attachments: SAEAttachments, config: Config) -> RequestSAE:
    """A steering spec alone, clamped to STEERING_MAX_STRENGTH, its deltas on the device."""
    applied = spec.clamped(config.steering_max_strength)
    return RequestSAE(applied, in_field("steering", steering_deltas, applied, attachments), None)


def steering_deltas(spec: SteeringSpec, attachments: SAEAttachments) -> dict[HookPoint, torch.Tensor]:
    """Every feature and vector summed per hook point (in float32, then cast to the model's dtype)."""
    sums: dict[HookPoint, torch.Tensor] = {}

    def add(point: HookPoint, delta: torch.Tensor) -> None:
        sums[point] = sums[point] + delta if point in sums else delta

    if spec.features:
        if spec.sae_id is None:
            raise ValueError("steering features need an sae_id")
        attached = in_field("steering.sae_id", attachments.attach, spec.sae_id)
        features = [(feature.index, feature.strength) for feature in spec.features]
        add(attached.point, steering_direction(attached.sae, features).float())
    for position, vector in enumerate(spec.vectors):
        where = f"steering.vectors.{position}"
        point = in_field(f"{where}.layer", attachments.vector_point, vector)
        source = f"{where}.path" if vector.path is not None else f"{where}.values"
        add(point, vector.strength * in_field(source, attachments.vector, vector))
    return {point: delta.to(attachments.dtype) for point, delta in sums.items()}


def resolve_monitor(request: EngineRequest, attachments: SAEAttachments, config: Config) -> RequestMonitor:
    spec = request.monitor
    if not 1 <= spec.top_k <= config.monitor_max_top_k:
        message = f"monitor top_k must lie in [1, {config.monitor_max_top_k}], got {spec.top_k}"
        raise RequestFieldError(message, "monitor.top_k")
    num_values = spec.max_values(len(request.prompt_token_ids), request.sampling.max_tokens)
    if num_values > config.monitor_max_values:
        message = f"the monitor could return {num_values} values; at most {config.monitor_max_values} fit"
        raise RequestFieldError(message, "monitor.positions")
    attached = in_field("monitor.sae_id", attachments.attach, spec.sae_id)
    features = None
    if spec.features is not None:
        d_sae = attached.sae.config.d_sae
        if not spec.features or len(set(spec.features)) != len(spec.features):
            raise RequestFieldError("monitor features must be a non-empty list of distinct indices", "monitor.features")
        if any(not 0 <= index < d_sae for index in spec.features):
            raise RequestFieldError(f"monitor feature indices must lie in [0, {d_sae})", "monitor.features")
        features = torch.tensor(spec.features, dtype=torch.long, device=attachments.device)
    return RequestMonitor(spec, attached.sae, attached.point, features, len(request.prompt_token_ids))
