"""Every Redis key steerbatch uses, under the one prefix, and the client that reads them."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from tasks.config import Config


@dataclass(frozen=True)
class RedisKeys:
    prefix: str

    def request_stream(self, request_id: str) -> str:
        return f"{self.prefix}stream:req:{request_id}"

    def cancel_flag(self, request_id: str) -> str:
        return f"{self.prefix}cancel:{request_id}"

    def stream_attachers(self, request_id: str) -> str:
        """A sorted set: the relays reading a request's stream, each scored by when its lease ends."""
        return f"{self.prefix}attachers:{request_id}"

    def detached_streams(self) -> str:
        """A sorted set: request ids, each scored by when it is cancelled unless someone reads its stream."""
        return f"{self.prefix}streams:detached"

    def worker_lease(self, worker: str) -> str:
        return f"{self.prefix}lease:worker:{worker}"

    def batch_stream(self, batch_id: str) -> str:
        return f"{self.prefix}stream:batch:{batch_id}"

    def batch_published_lines(self, batch_id: str) -> str:
        """The line numbers whose event the batch's stream has, so that each line's is written once."""
        return f"{self.prefix}lines:batch:{batch_id}"

    def batch_stop_flag(self, batch_id: str) -> str:
        return f"{self.prefix}stop:batch:{batch_id}"

    def stream_hub_wake(self, hub_id: str) -> str:
        return f"{self.prefix}hub:{hub_id}"

    def live_workers(self) -> str:
        """A sorted set: each worker scored by when its lease ends, so the api counts live ones in one call."""
        return f"{self.prefix}workers"

    def live_workers_of(self, model: str) -> str:
        """`live_workers` of one served model's workers."""
        return f"{self.prefix}workers:model:{model}"


# Connections beyond one per open client connection of the api: its stream hub, reapers and watchers
POOL_HEADROOM = 64
POOL_WAIT_S = 10.0  # how long a caller waits for a free connection before the call fails


def connect_redis(config: Config, *, block_s: float = 0.0) -> redis.Redis:
    """A client whose reads outlast the longest XREAD block we issue. Its pool holds as many connections as the api
    has client connections, and a caller past that waits for one: redis-py's default pool (100 connections in
    redis-py 8.1) failed calls with "Too many connections" when a burst of 500 streams had more greenlets in Redis at
    once."""
    pool = redis.BlockingConnectionPool.from_url(
        config.redis_url,
        max_connections=config.api_connections + POOL_HEADROOM,
        timeout=POOL_WAIT_S,
        decode_responses=True,
        socket_connect_timeout=2,
        socket_timeout=block_s + 10,
        health_check_interval=30,
    )
    return redis.Redis.from_pool(pool)  # closing the client closes its pool
