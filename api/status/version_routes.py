"""GET /version: the steerbatch package's version, as vLLM's /version answers its own."""

from __future__ import annotations

from importlib.metadata import version

from flask import Blueprint, Response, jsonify

bp = Blueprint("version", __name__)


@bp.get("/version")
def server_version() -> Response:
    return jsonify({"version": version("steerbatch")})
