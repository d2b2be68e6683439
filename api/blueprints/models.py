"""GET /v1/models and /v1/models/{id}"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify

from api.errors import APIError
from api.services import services

bp = Blueprint("models", __name__)


def _model_object() -> dict[str, Any]:
    info = services().model_info
    return {
        "id": info.name,
        "object": "model",
        "created": services().started_at,
        "owned_by": "steerbatch",
        "max_model_len": info.max_model_len,
    }


@bp.get("/v1/models")
def list_models() -> Response:
    return jsonify({"object": "list", "data": [_model_object()]})


@bp.get("/v1/models/<path:model_id>")
def retrieve_model(model_id: str) -> Response:
    model = _model_object()
    if model_id != model["id"]:
        raise APIError(404, f"The model `{model_id}` does not exist.", param="model", code="model_not_found")
    return jsonify(model)
