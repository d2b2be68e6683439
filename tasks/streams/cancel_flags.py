"""A request's cancel flag in Redis: set by whoever cancels it, read by the worker running it."""

from __future__ import annotations

import redis

from tasks.config import Config
from tasks.streams.redis_keys import RedisKeys


def request_cancel(client: redis.Redis, config: Config, request_id: str) -> None:
    client.set(RedisKeys(config.redis_prefix).cancel_flag(request_id), "1", ex=config.stream_ttl_s)


def is_cancel_requested(client: redis.Redis, config: Config, request_id: str) -> bool:
    return bool(client.exists(RedisKeys(config.redis_prefix).cancel_flag(request_id)))


def read_cancel_flags(client: redis.Redis, config: Config, request_ids: list[str]) -> set[str]:
    """The requests of `request_ids` whose client asked to cancel, in one round trip."""
    keys = RedisKeys(config.redis_prefix)
    values = client.mget([keys.cancel_flag(request_id) for request_id in request_ids])
    return {request_id for request_id, value in zip(request_ids, values, strict=True) if value}
