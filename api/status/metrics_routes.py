"""GET /metrics: Prometheus' text format for the api and every live worker (docs/OPERATIONS.md). An admin key reads
it: it shows every tenant's load. In open mode (no key exists, loopback only) it is open like every route."""

from __future__ import annotations

from flask import Blueprint, Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.gate.auth import require_admin
from api.observability.cluster import read_cluster
from api.observability.render import render_metrics
from api.services import db_session, services

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def metrics() -> Response:
    require_admin("read /metrics", why="they show every tenant's load")
    state = read_cluster(services().redis, services().config, db_session())
    return Response(render_metrics(state), content_type=CONTENT_TYPE_LATEST)
