"""GET /v1/saes: the SAEs the live workers can steer and monitor with, as they publish them."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from api.steering import sae_listings

bp = Blueprint("saes", __name__)


@bp.get("/v1/saes")
def list_saes() -> Response:
    return jsonify({"object": "list", "data": [{**listing, "object": "sae"} for listing in sae_listings().values()]})
