"""Steering state in Redis: the model's SAE listing expires with the lease, the profile and the monitor settings
round-trip and clear, and each worker's monitor statistics come back under its name."""

from __future__ import annotations

import uuid

import redis

from tasks.config import Config
from tasks.messages.steering import SteeringFeature, SteeringSpec, SteeringVector
from tasks.steering_store import (
    publish_monitor_stats,
    publish_saes,
    read_monitor_settings,
    read_monitor_stats,
    read_profile,
    read_saes,
    write_monitor_settings,
    write_profile,
)

LISTING = {"id": "tiny/resid_post_2", "hook_name": "blocks.2.hook_resid_post", "d_in": 8, "d_sae": 16}


def setup(redis_url: str) -> tuple[redis.Redis, Config]:
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:", worker_lease_s=0.3)
    return redis.Redis.from_url(redis_url, decode_responses=True), config


def test_the_sae_listing_lives_as_long_as_a_lease(redis_url: str) -> None:
    client, config = setup(redis_url)
    assert read_saes(client, config, config.model_name) == {}
    publish_saes(client, config, [LISTING])
    assert read_saes(client, config, config.model_name) == {LISTING["id"]: LISTING}
    assert 0 < client.pttl(f"{config.redis_prefix}saes:{config.model_name}") <= 300


def test_the_profile_and_the_monitor_settings_round_trip_and_clear(redis_url: str) -> None:
    client, config = setup(redis_url)
    profile = SteeringSpec("a/b", (SteeringFeature(1, 2.0),), (SteeringVector(0, 1.0, values=(0.5,)),))
    assert read_profile(client, config) is None
    write_profile(client, config, profile)
    assert read_profile(client, config) == profile
    write_profile(client, config, None)
    assert read_profile(client, config) is None
    write_monitor_settings(client, config, {"sae_id": "a/b", "features": [1], "id": "x"})
    assert read_monitor_settings(client, config) == {"sae_id": "a/b", "features": [1], "id": "x"}
    write_monitor_settings(client, config, None)
    assert read_monitor_settings(client, config) is None


def test_monitor_stats_come_back_per_worker(redis_url: str) -> None:
    client, config = setup(redis_url)
    publish_monitor_stats(client, config, "w2@host", {"count": 2})
    publish_monitor_stats(client, config, "w1@host", {"count": 1})
    assert read_monitor_stats(client, config) == [{"worker": "w1@host", "count": 1}, {"worker": "w2@host", "count": 2}]
    publish_monitor_stats(client, config, "w1@host", None)
    assert read_monitor_stats(client, config) == [{"worker": "w2@host", "count": 2}]
