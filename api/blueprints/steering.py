"""The worker-wide steering profile (GET/PUT/DELETE /v1/steering/profile), which steers every request that names no
steering of its own, and the worker-wide monitor (GET/PUT/DELETE /v1/monitor): running statistics of chosen SAE
features over all traffic, per worker."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, Response, jsonify

from api.generation import json_body
from api.services import services
from api.steering import steering_spec, worker_monitor_settings
from api.steering_schemas import SteeringBody, WorkerMonitorBody
from tasks.steering_store import (
    read_monitor_settings,
    read_monitor_stats,
    read_profile,
    write_monitor_settings,
    write_profile,
)

bp = Blueprint("steering", __name__)


def _profile_object() -> dict[str, Any]:
    svc = services()
    profile = read_profile(svc.redis, svc.config)
    return {"object": "steering.profile", "profile": None if profile is None else profile.to_dict()}


@bp.get("/v1/steering/profile")
def get_profile() -> Response:
    return jsonify(_profile_object())


@bp.put("/v1/steering/profile")
def put_profile() -> Response:
    body = SteeringBody.model_validate(json_body())
    svc = services()
    write_profile(svc.redis, svc.config, steering_spec(body, svc.model_info, prefix=""))
    return jsonify(_profile_object())


@bp.delete("/v1/steering/profile")
def delete_profile() -> Response:
    svc = services()
    write_profile(svc.redis, svc.config, None)
    return jsonify(_profile_object())


def _monitor_object() -> dict[str, Any]:
    svc = services()
    settings = read_monitor_settings(svc.redis, svc.config)
    return {"object": "monitor", "settings": settings, "workers": read_monitor_stats(svc.redis, svc.config)}


@bp.get("/v1/monitor")
def get_monitor() -> Response:
    return jsonify(_monitor_object())


@bp.put("/v1/monitor")
def put_monitor() -> Response:
    """Each PUT restarts the statistics (a new settings id), even with the same features."""
    settings = worker_monitor_settings(WorkerMonitorBody.model_validate(json_body()))
    svc = services()
    write_monitor_settings(svc.redis, svc.config, {**settings, "id": uuid.uuid4().hex})
    return jsonify(_monitor_object())


@bp.delete("/v1/monitor")
def delete_monitor() -> Response:
    svc = services()
    write_monitor_settings(svc.redis, svc.config, None)
    return jsonify(_monitor_object())
