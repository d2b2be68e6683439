"""GET /health: 200 when Redis and the database answer, else 503."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from sqlalchemy import text

from api.services import db_session, services

bp = Blueprint("health", __name__)


@bp.get("/health")
def health() -> Response:
    services().redis.ping()
    db_session().execute(text("SELECT 1"))
    return jsonify({"status": "ok", "model": services().model_info.name})
