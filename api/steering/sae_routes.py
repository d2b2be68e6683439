"""GET /v1/saes[?model=<name>]: the SAEs the live workers of a served model (default: the default one) can steer and
monitor with, as they publish them."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request

from api.services import model_info_for, services
from api.steering.specs import sae_listings

bp = Blueprint("saes", __name__)


@bp.get("/v1/saes")
def list_saes() -> Response:
    info = model_info_for(request.args.get("model", services().model_info.name))
    listings = sae_listings(info.name).values()
    return jsonify({"object": "list", "data": [{**listing, "object": "sae"} for listing in listings]})
