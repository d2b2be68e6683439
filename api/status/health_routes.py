"""GET /health: liveness, 200 while Redis and the database answer, else 503. GET /health/ready: per served model,
its live workers and queues; 503 while a served model has no live worker.

Both are open, like a load balancer's or an orchestrator's probe needs them: neither shows a tenant's data or a
key, only counts, worker names and heartbeat ages, the same that any caller learns from a 503 no_worker_available.
/metrics, with every tenant's load over time, needs an admin key."""

from __future__ import annotations

import redis
import sqlalchemy.exc
from flask import Blueprint, Response, jsonify
from sqlalchemy import text

from api.errors import unavailable
from api.observability.cluster import read_cluster
from api.observability.readiness import readiness
from api.services import db_session, services

bp = Blueprint("health", __name__)


@bp.get("/health")
def health() -> Response | tuple[Response, int]:
    try:
        services().redis.ping()
        db_session().execute(text("SELECT 1"))
    except (redis.RedisError, sqlalchemy.exc.SQLAlchemyError) as exc:
        return unavailable(exc)  # any failure of theirs, not only a lost connection: 503 in OpenAI's shape
    return jsonify({"status": "ok", "model": services().model_info.name})


@bp.get("/health/ready")
def ready() -> tuple[Response, int]:
    body, is_ready = readiness(read_cluster(services().redis, services().config, db_session()))
    return jsonify(body), 200 if is_ready else 503
