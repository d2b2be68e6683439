"""Steering state shared through Redis: the SAE listing of the workers serving the model and each worker's monitor
statistics (both expiring with the lease), the worker-wide steering profile, each tenant's own steering profile, and
the worker-wide monitor's settings.

Workers publish what only they can know (which SAEs fit their model); the api, which never loads torch, reads it to
list SAEs and to validate requests against them.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from tasks.config import Config
from tasks.messages.steering import SteeringSource, SteeringSpec


def _saes_key(config: Config, model: str) -> str:
    """One key per served model: its workers share the SAE root, so they list the same SAEs."""
    return f"{config.redis_prefix}saes:{model}"


def _monitor_stats_key(config: Config, worker: str) -> str:
    return f"{config.redis_prefix}monitor:stats:{worker}"


def _profile_key(config: Config, tenant: str | None = None) -> str:
    """The worker-wide profile's key, or with `tenant` that tenant's own (key creation checks tenant names)."""
    suffix = "" if tenant is None else f":tenant:{tenant}"
    return f"{config.redis_prefix}steering:profile{suffix}"


def _monitor_settings_key(config: Config) -> str:
    return f"{config.redis_prefix}monitor:settings"


def publish_saes(client: redis.Redis, config: Config, listings: list[dict[str, Any]]) -> None:
    client.set(_saes_key(config, config.model_name), json.dumps(listings), px=int(config.worker_lease_s * 1000))


def read_saes(client: redis.Redis, config: Config, model: str) -> dict[str, dict[str, Any]]:
    """The SAEs of the served `model` by id; none while no worker of it is alive. One GET: it runs on every steered
    request."""
    raw = client.get(_saes_key(config, model))
    return {listing["id"]: listing for listing in json.loads(raw)} if raw else {}


def write_profile(client: redis.Redis, config: Config, profile: SteeringSpec | None, tenant: str | None = None) -> None:
    """The worker-wide profile, or with `tenant` that tenant's own; None clears it."""
    if profile is None:
        client.delete(_profile_key(config, tenant))
    else:
        client.set(_profile_key(config, tenant), json.dumps(profile.to_dict()))


def read_profile(client: redis.Redis, config: Config, tenant: str | None = None) -> SteeringSpec | None:
    raw = client.get(_profile_key(config, tenant))
    return None if raw is None else SteeringSpec.from_dict(json.loads(raw))


def default_steering(client: redis.Redis, config: Config, tenant: str) -> tuple[SteeringSpec | None, SteeringSource]:
    """The steering of a request that names none: its tenant's profile if the tenant set one, else the worker-wide
    profile (None when neither exists). One round trip; read when the request runs, so a PUT applies at once."""
    return steering_of_profiles(*client.mget(profile_keys(config, tenant)))


def profile_keys(config: Config, tenant: str) -> tuple[str, str]:
    """The keys of `tenant`'s own profile and of the worker-wide one, for a caller that reads them together with
    keys of its own (`steering_of_profiles` turns their values into the steering)."""
    return _profile_key(config, tenant), _profile_key(config)


def steering_of_profiles(own: bytes | None, worker_wide: bytes | None) -> tuple[SteeringSpec | None, SteeringSource]:
    """`default_steering` from the two profiles' stored values."""
    if own is not None:
        return SteeringSpec.from_dict(json.loads(own)), SteeringSource.TENANT_PROFILE
    return (None if worker_wide is None else SteeringSpec.from_dict(json.loads(worker_wide))), SteeringSource.PROFILE


def write_monitor_settings(client: redis.Redis, config: Config, settings: dict[str, Any] | None) -> None:
    """`settings` {"sae_id", "features"}; a new write restarts every worker's statistics (None stops them)."""
    if settings is None:
        client.delete(_monitor_settings_key(config))
    else:
        client.set(_monitor_settings_key(config), json.dumps(settings))


def read_monitor_settings(client: redis.Redis, config: Config) -> dict[str, Any] | None:
    raw = client.get(_monitor_settings_key(config))
    return None if raw is None else json.loads(raw)


def publish_monitor_stats(client: redis.Redis, config: Config, worker: str, stats: dict[str, Any] | None) -> None:
    if stats is None:
        client.delete(_monitor_stats_key(config, worker))
    else:
        client.set(_monitor_stats_key(config, worker), json.dumps(stats), px=int(config.worker_lease_s * 1000))


def read_monitor_stats(client: redis.Redis, config: Config) -> list[dict[str, Any]]:
    """Each live worker's snapshot, with its name under "worker"."""
    prefix = _monitor_stats_key(config, "")
    snapshots = []
    for key in sorted(client.scan_iter(match=_monitor_stats_key(config, "*"), count=100)):
        raw = client.get(key)
        if raw is not None:
            snapshots.append({"worker": key.removeprefix(prefix), **json.loads(raw)})
    return snapshots
