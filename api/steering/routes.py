"""Steering profiles (GET/PUT/DELETE /v1/steering/profile) and the worker-wide monitor (GET/PUT/DELETE /v1/monitor).

A profile steers every request that names no steering of its own. There are two kinds, `?scope=`:
- `tenant`: the caller's tenant's own, for its requests only (the default for a user key);
- `worker`: the worker-wide one, for every tenant whose own is unset (the default for an admin key).
A tenant's own wins over the worker-wide one, and a response's `steering.source` says which applied. Any key may
read either; only an admin key may change the worker-wide profile or the monitor, which change what every tenant
gets. The monitor keeps running statistics of chosen SAE features over all traffic, per worker."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, Response, jsonify, request

from api.errors import APIError
from api.gate.auth import current_principal, require_admin
from api.gate.request_limits import read_json_object
from api.services import services
from api.steering.schemas import SteeringBody, WorkerMonitorBody
from api.steering.specs import steering_spec, worker_monitor_settings
from tasks.steering_store import (
    read_monitor_settings,
    read_monitor_stats,
    read_profile,
    write_monitor_settings,
    write_profile,
)

bp = Blueprint("steering", __name__)
TENANT_SCOPE, WORKER_SCOPE = "tenant", "worker"


def _profile_tenant(*, is_write: bool) -> str | None:
    """The tenant whose profile `?scope=` names, None for the worker-wide one; writing that one needs an admin key."""
    principal = current_principal()
    scope = request.args.get("scope", WORKER_SCOPE if principal.is_admin else TENANT_SCOPE)
    if scope not in (TENANT_SCOPE, WORKER_SCOPE):
        raise APIError(400, f"scope must be {TENANT_SCOPE!r} or {WORKER_SCOPE!r}", param="scope")
    if scope == TENANT_SCOPE:
        return principal.tenant
    if is_write:
        require_admin("change the worker-wide steering profile")
    return None


def _profile_object(tenant: str | None) -> dict[str, Any]:
    svc = services()
    profile = read_profile(svc.redis, svc.config, tenant)
    return {
        "object": "steering.profile",
        "scope": WORKER_SCOPE if tenant is None else TENANT_SCOPE,
        "tenant": tenant,
        "profile": None if profile is None else profile.to_dict(),
    }


@bp.get("/v1/steering/profile")
def get_profile() -> Response:
    return jsonify(_profile_object(_profile_tenant(is_write=False)))


@bp.put("/v1/steering/profile")
def put_profile() -> Response:
    tenant = _profile_tenant(is_write=True)
    body = SteeringBody.model_validate(read_json_object())
    svc = services()
    write_profile(svc.redis, svc.config, steering_spec(body, svc.model_info, prefix=""), tenant)
    return jsonify(_profile_object(tenant))


@bp.delete("/v1/steering/profile")
def delete_profile() -> Response:
    tenant = _profile_tenant(is_write=True)
    svc = services()
    write_profile(svc.redis, svc.config, None, tenant)
    return jsonify(_profile_object(tenant))


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
    require_admin("change the worker-wide monitor")
    settings = worker_monitor_settings(WorkerMonitorBody.model_validate(read_json_object()))
    svc = services()
    write_monitor_settings(svc.redis, svc.config, {**settings, "id": uuid.uuid4().hex})
    return jsonify(_monitor_object())


@bp.delete("/v1/monitor")
def delete_monitor() -> Response:
    require_admin("change the worker-wide monitor")
    svc = services()
    write_monitor_settings(svc.redis, svc.config, None)
    return jsonify(_monitor_object())
