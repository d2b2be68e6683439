"""The live-worker registry on a real Redis: each worker's lease names its model, so liveness is known per model,
and a worker that stops renewing leaves its model's count and the listing when its lease ends."""

from __future__ import annotations

import dataclasses
import time
import uuid

import redis

from tasks.config import Config
from tasks.streams.worker_leases import live_workers, num_live_workers, renew_worker_lease
from tasks.streams.worker_stats import WorkerStats, publish_worker_stats, read_live_worker_stats


def test_liveness_is_per_model_and_lapses_with_the_lease(redis_url: str) -> None:
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:", worker_lease_s=0.5)
    tiny = dataclasses.replace(config, model="/m/tiny")
    draft = dataclasses.replace(config, model="/m/x", served_model_name="tiny-draft")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    renew_worker_lease(client, tiny, "w1@a")
    renew_worker_lease(client, tiny, "w2@b")
    renew_worker_lease(client, draft, "w3@a")
    assert (num_live_workers(client, config), num_live_workers(client, config, "tiny")) == (3, 2)
    assert num_live_workers(client, config, "tiny-draft") == 1 and num_live_workers(client, config, "other") == 0
    listed = {worker.name: worker for worker in live_workers(client, config)}
    assert {name: worker.model for name, worker in listed.items()} == {
        "w1@a": "tiny",
        "w2@b": "tiny",
        "w3@a": "tiny-draft",
    }
    assert all(0 <= worker.heartbeat_age_s < 0.5 for worker in listed.values())
    assert listed["w3@a"].to_dict()["model"] == "tiny-draft"

    time.sleep(0.3)
    renew_worker_lease(client, tiny, "w1@a")
    renew_worker_lease(client, tiny, "w2@b")
    time.sleep(0.3)  # w3's lease has ended; the others were renewed
    assert num_live_workers(client, config, "tiny-draft") == 0 and num_live_workers(client, config, "tiny") == 2
    assert sorted(worker.name for worker in live_workers(redis.Redis.from_url(redis_url), config)) == ["w1@a", "w2@b"]


def test_published_stats_name_the_workers_model(redis_url: str) -> None:
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:", served_model_name="tiny-draft")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    renew_worker_lease(client, config, "w1@a")
    stats = WorkerStats("w1@a", config.model_name, time.time(), 2, {"interactive": 0, "bulk": 1}, 0.25, {}, [])
    publish_worker_stats(client, config, stats)
    assert read_live_worker_stats(client, config) == [stats]
    assert [worker.model for worker in live_workers(client, config)] == ["tiny-draft"]  # the lease names it too
