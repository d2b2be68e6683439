"""Worker leases in Redis: each worker renews its own, naming the model it serves, so anyone can tell which
workers are alive and what they serve."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from tasks.config import Config
from tasks.streams.redis_keys import RedisKeys


@dataclass(frozen=True)
class LiveWorker:
    name: str
    model: str
    heartbeat_age_s: float  # since its last lease renewal

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "model": self.model, "heartbeat_age_s": self.heartbeat_age_s}


def renew_worker_lease(client: redis.Redis, config: Config, worker: str) -> None:
    """The lease of `worker`, serving `config`'s model: its key holds the model's name."""
    keys = RedisKeys(config.redis_prefix)
    now = time.time()
    with client.pipeline(transaction=False) as pipe:
        pipe.set(keys.worker_lease(worker), config.model_name, px=int(config.worker_lease_s * 1000))
        for registry in (keys.live_workers(), keys.live_workers_of(config.model_name)):
            pipe.zadd(registry, {worker: now + config.worker_lease_s})
            pipe.zremrangebyscore(registry, "-inf", now - 3600)  # workers gone for an hour
        pipe.execute()


def num_live_workers(client: redis.Redis, config: Config, model: str | None = None) -> int:
    """Workers alive now, of every model or of `model`, in one call."""
    return int(count_live_workers(client, config, model))


def count_live_workers(commands: redis.Redis | redis.client.Pipeline, config: Config, model: str | None = None) -> Any:
    """`num_live_workers`'s one command, on a client (the count) or queued on a pipeline (the pipeline)."""
    keys = RedisKeys(config.redis_prefix)
    registry = keys.live_workers() if model is None else keys.live_workers_of(model)
    return commands.zcount(registry, time.time(), "+inf")


def live_workers(client: redis.Redis, config: Config) -> list[LiveWorker]:
    """Every worker alive now, with the model it serves, in two calls."""
    keys = RedisKeys(config.redis_prefix)
    now = time.time()
    leases = live_worker_leases(client, config, now)
    if not leases:
        return []
    models = client.mget([keys.worker_lease(name) for name, _ in leases])
    return [
        LiveWorker(name, _text(model), round(max(0.0, now - (ends_at - config.worker_lease_s)), 3))
        for (name, ends_at), model in zip(leases, models, strict=True)
        if model is not None  # its lease lapsed between the two calls
    ]


def live_worker_leases(client: redis.Redis, config: Config, now: float | None = None) -> list[tuple[str, float]]:
    """(worker, when its lease ends) of every worker alive at `now` (default: this moment), in one call."""
    since = time.time() if now is None else now
    registry = RedisKeys(config.redis_prefix).live_workers()
    return [(_text(name), ends_at) for name, ends_at in client.zrangebyscore(registry, since, "+inf", withscores=True)]


def _text(value: str | bytes) -> str:
    """A reply as text, from a client that decodes replies or one that does not."""
    return value.decode() if isinstance(value, bytes) else value


def is_worker_alive(client: redis.Redis, config: Config, worker: str) -> bool:
    return bool(client.exists(RedisKeys(config.redis_prefix).worker_lease(worker)))
