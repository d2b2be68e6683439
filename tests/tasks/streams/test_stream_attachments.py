"""Who reads a request's stream, on a real Redis: a request is taken for cancelling only once nobody has read its
stream for a grace, by exactly one reaper, and a relay that vanished without detaching stops counting."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from tasks.config import Config
from tasks.streams.attachments import StreamAttachment, attach, lease_s, take_abandoned
from tasks.streams.redis_keys import RedisKeys

GRACE_S = 0.4


@pytest.fixture
def parts(redis_url: str) -> Iterator[tuple[redis.Redis, Config]]:
    # a lease of 3 x 0.1 s
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:", sse_heartbeat_s=0.1,
                    stream_resume_grace_s=GRACE_S)  # fmt: skip
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client, config
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def taken_within(client: redis.Redis, config: Config, seconds: float) -> list[str]:
    """Every request taken by reaper passes in the next `seconds`."""
    taken: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        taken += take_abandoned(client, config)
        time.sleep(0.02)
    return taken


def test_a_dropped_stream_is_taken_a_grace_later_and_only_once(parts: tuple[redis.Redis, Config]) -> None:
    client, config = parts
    attach(client, config, "r1").detach()
    assert taken_within(client, config, GRACE_S - 0.15) == []
    assert taken_within(client, config, 0.4) == ["r1"]
    assert take_abandoned(client, config) == [] and client.zcard(RedisKeys(config.redis_prefix).detached_streams()) == 0


def test_a_reader_that_comes_back_keeps_it_and_a_new_drop_gets_a_new_grace(parts: tuple[redis.Redis, Config]) -> None:
    client, config = parts
    attach(client, config, "r1").detach()
    time.sleep(GRACE_S / 2)
    back = attach(client, config, "r1")
    assert taken_within(client, config, GRACE_S) == []  # the first grace ran out while it read
    back.detach()
    assert taken_within(client, config, GRACE_S - 0.15) == []
    assert taken_within(client, config, 0.4) == ["r1"]


def test_a_live_reader_is_never_taken_while_it_renews(parts: tuple[redis.Redis, Config]) -> None:
    client, config = parts
    reader = attach(client, config, "r1")
    deadline = time.monotonic() + lease_s(config) + 2 * GRACE_S
    while time.monotonic() < deadline:
        reader.renew_if_due()
        assert take_abandoned(client, config) == []
        time.sleep(0.03)


def test_one_of_two_readers_leaving_leaves_the_other_reading(parts: tuple[redis.Redis, Config]) -> None:
    client, config = parts
    staying, leaving = attach(client, config, "r1"), attach(client, config, "r1")
    leaving.detach()
    deadline = time.monotonic() + 2 * GRACE_S
    while time.monotonic() < deadline:
        staying.renew_if_due()
        assert take_abandoned(client, config) == []
        time.sleep(0.03)
    staying.detach()
    assert taken_within(client, config, GRACE_S + 0.2) == ["r1"]


def test_a_reader_whose_api_died_counts_until_its_lease_ends_then_a_grace(parts: tuple[redis.Redis, Config]) -> None:
    client, config = parts
    attached_at = time.monotonic()
    StreamAttachment(client, config, "r1").hold()  # never renewed nor detached: its api process died
    while time.monotonic() - attached_at < lease_s(config) + GRACE_S - 0.15:
        assert take_abandoned(client, config) == []
        time.sleep(0.02)
    assert taken_within(client, config, 0.4) == ["r1"]


def test_several_reapers_take_each_request_once(parts: tuple[redis.Redis, Config]) -> None:
    client, config = parts
    for request_id in ("r1", "r2", "r3"):
        attach(client, config, request_id).detach()
    time.sleep(GRACE_S + 0.05)
    start = threading.Barrier(4)

    def reap() -> list[str]:
        reaper = redis.Redis.from_url(config.redis_url, decode_responses=True)
        start.wait()
        return take_abandoned(reaper, config)

    with ThreadPoolExecutor(4) as pool:
        passes = [pool.submit(reap) for _ in range(4)]
        taken = [request_id for done in passes for request_id in done.result()]
    assert sorted(taken) == ["r1", "r2", "r3"]
