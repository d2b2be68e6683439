"""Steering and monitor specs from validated bodies, checked against the SAEs the workers publish and the model's
shape: unknown sae_id, feature index >= d_sae, a vector that does not fit the model, or a monitor that could return
more than the cap is a 400 naming the field."""

from __future__ import annotations

from typing import Any

from api.chat.schemas import GenerationFields
from api.errors import APIError
from api.models.model_info import ModelInfo
from api.services import services
from api.steering.schemas import MonitorBody, SteeringBody, WorkerMonitorBody
from tasks.messages.steering import MonitorSpec, SteeringSpec
from tasks.steering_store import read_saes


def sae_listings(model: str) -> dict[str, dict[str, Any]]:
    """The SAEs the live workers of the served `model` publish."""
    svc = services()
    return read_saes(svc.redis, svc.config, model)


def check_sae(sae_id: str, listings: dict[str, dict[str, Any]], param: str) -> dict[str, Any]:
    if sae_id not in listings:
        known = ", ".join(listings) or "none: no worker has published its SAEs"
        message = f"Unknown sae_id {sae_id!r}; the workers serve: {known}."
        raise APIError(400, message, param=param, code="sae_not_found")
    return listings[sae_id]


def check_indices(indices: list[int], d_sae: int, param: str) -> None:
    for position, index in enumerate(indices):
        if index >= d_sae:
            raise APIError(400, f"Feature index {index} is outside [0, {d_sae}).", param=param.format(position))


def steering_spec(body: SteeringBody, info: ModelInfo, prefix: str = "steering.") -> SteeringSpec:
    """`prefix` leads every `param` named: the field holding the body ("" when it is the whole body)."""
    if body.sae_id is not None:
        listing = check_sae(body.sae_id, sae_listings(info.name), f"{prefix}sae_id")
        check_indices([feature.index for feature in body.features], listing["d_sae"], f"{prefix}features.{{}}.index")
    for position, vector in enumerate(body.vectors):
        where = f"{prefix}vectors.{position}"
        if info.num_layers and vector.layer >= info.num_layers:
            message = f"Layer {vector.layer} is outside the model's {info.num_layers} layers."
            raise APIError(400, message, param=f"{where}.layer")
        if info.hidden_size and vector.values is not None and len(vector.values) != info.hidden_size:
            message = f"The vector has {len(vector.values)} values; the model's hidden size is {info.hidden_size}."
            raise APIError(400, message, param=f"{where}.values")
    return body.to_spec()


def monitor_spec(info: ModelInfo, body: MonitorBody, num_prompt_tokens: int, max_tokens: int) -> MonitorSpec:
    config = services().config
    listing = check_sae(body.sae_id, sae_listings(info.name), "monitor.sae_id")
    check_indices(body.features or [], listing["d_sae"], "monitor.features.{}")
    if body.top_k > config.monitor_max_top_k:
        message = f"monitor.top_k is at most {config.monitor_max_top_k}."
        raise APIError(400, message, param="monitor.top_k")
    spec = body.to_spec()
    num_values = spec.max_values(num_prompt_tokens, max_tokens)
    if num_values > config.monitor_max_values:
        message = (
            f"The monitor could return {num_values} values (positions x top_k); at most {config.monitor_max_values} "
            "are allowed: monitor fewer positions, lower top_k, or lower max_tokens."
        )
        raise APIError(400, message, param="monitor.positions")
    return spec


def worker_monitor_settings(body: WorkerMonitorBody) -> dict[str, Any]:
    listing = check_sae(body.sae_id, sae_listings(services().model_info.name), "sae_id")
    check_indices(body.features, listing["d_sae"], "features.{}")
    return {"sae_id": body.sae_id, "features": list(body.features)}


def steering_and_monitor(
    info: ModelInfo, fields: GenerationFields, num_prompt_tokens: int, max_tokens: int
) -> tuple[SteeringSpec | None, MonitorSpec | None]:
    """What a chat, completions or batch-line body asks for; None where it says nothing."""
    steering = None if fields.steering is None else steering_spec(fields.steering, info)
    monitor = None if fields.monitor is None else monitor_spec(info, fields.monitor, num_prompt_tokens, max_tokens)
    return steering, monitor
