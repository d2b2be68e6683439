"""GET /v1/models and /v1/models/{id}: the served models that have a live worker now."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from api.errors import APIError
from api.models.model_info import ModelInfo
from api.services import services
from tasks.streams.worker_leases import live_workers
from tasks.streams.worker_stats import read_live_worker_stats

bp = Blueprint("models", __name__)


def _model_object(info: ModelInfo, quantizations: dict[str, str]) -> dict[str, Any]:
    return {
        "id": info.name,
        "object": "model",
        "created": services().started_at,
        "owned_by": "steerbatch",
        "max_model_len": info.max_model_len,
        "quantization": quantizations.get(info.name, "none"),
    }


def _quantizations() -> dict[str, str]:
    """How each served model's live workers load its weights ("none", or "<method>:<scheme>"), by model; workers of
    one model that differ are listed together."""
    methods: dict[str, set[str]] = {}
    for worker in read_live_worker_stats(services().redis, services().config):
        methods.setdefault(worker.model, set()).add(worker.quantization)
    return {model: ",".join(sorted(names)) for model, names in methods.items()}


def _listed_models() -> dict[str, ModelInfo]:
    """Served models in the configured order, those without a live worker left out (a request for one answers 503)."""
    svc = services()
    live = {worker.model for worker in live_workers(svc.redis, svc.config)}
    return {name: info for name, info in svc.models.items() if name in live}


@bp.get("/v1/models")
def list_models() -> Response:
    quantizations = _quantizations()
    return jsonify(
        {"object": "list", "data": [_model_object(info, quantizations) for info in _listed_models().values()]}
    )


@bp.get("/v1/models/<path:model_id>")
def retrieve_model(model_id: str) -> Response:
    info = _listed_models().get(model_id)
    if info is None:
        raise APIError(404, f"The model `{model_id}` does not exist.", param="model", code="model_not_found")
    return jsonify(_model_object(info, _quantizations()))
