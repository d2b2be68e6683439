"""The worker's lease outlives its TTL while the engine is healthy and lapses once it is not."""

from __future__ import annotations

import threading
import time
import uuid

import redis

from tasks.config import Config
from tasks.streams.worker_leases import is_worker_alive
from worker.serving.lease import WorkerLease


def test_lease_is_renewed_while_healthy_and_lapses_when_not(redis_url: str) -> None:
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:", worker_lease_s=0.3)
    client = redis.Redis.from_url(redis_url)
    healthy = threading.Event()
    healthy.set()
    lease = WorkerLease(client, config, "w1", is_healthy=healthy.is_set)
    lease.start()
    time.sleep(1.0)  # three TTLs
    assert is_worker_alive(client, config, "w1")
    healthy.clear()
    time.sleep(0.8)
    assert not is_worker_alive(client, config, "w1")
    lease.stop()
