"""Each worker's engine counters, published to Redis beside its lease so the api, tests and operators can read them."""

from __future__ import annotations

import json
from typing import Any

import redis

from tasks.config import Config


def worker_stats_key(config: Config, worker: str) -> str:
    return f"{config.redis_prefix}stats:worker:{worker}"


def publish_worker_stats(client: redis.Redis, config: Config, worker: str, stats: dict[str, Any]) -> None:
    """Expires with the lease, so a dead worker's numbers do not linger as if it were alive; names its model."""
    published = {**stats, "model": config.model_name}
    client.set(worker_stats_key(config, worker), json.dumps(published), px=int(config.worker_lease_s * 1000))


def read_worker_stats(client: redis.Redis, config: Config, worker: str) -> dict[str, Any] | None:
    raw = client.get(worker_stats_key(config, worker))
    return None if raw is None else json.loads(raw)
