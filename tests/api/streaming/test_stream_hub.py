"""The api's stream hub on a real Redis: every reader's entries in order from its own position, new readers heard
at once, failures raised in every reader, the thread gone with the last reader."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from api.streaming import stream_hub
from api.streaming.stream_hub import StreamHub
from tasks.config import Config
from tasks.streams.events import STREAM_START, append_json
from tasks.streams.redis_keys import RedisKeys
from tests.conftest import free_port


@pytest.fixture
def config(redis_url: str) -> Iterator[Config]:
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:", stream_ttl_s=60)
    yield config
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def hub_for(config: Config) -> tuple[StreamHub, redis.Redis]:
    client = redis.Redis.from_url(config.redis_url, decode_responses=True, socket_timeout=60)
    return StreamHub(client, RedisKeys(config.redis_prefix).stream_hub_wake("test")), client


def test_each_reader_gets_its_streams_entries_in_order_from_its_own_position(config: Config) -> None:
    hub, client = hub_for(config)
    first, second = (RedisKeys(config.redis_prefix).request_stream(name) for name in ("a", "b"))
    early = append_json(client, config, first, {"n": 0})
    live = hub.read_json(first, early, 5000)
    replay = hub.read_json(first, STREAM_START, 5000)
    other = hub.read_json(second, STREAM_START, 5000)
    assert next(replay) == (early, {"n": 0})
    ids = [append_json(client, config, first, {"n": n}) for n in (1, 2)]
    ids.append(append_json(client, config, second, {"n": 3}))
    assert [next(live), next(live)] == [(ids[0], {"n": 1}), (ids[1], {"n": 2})]
    assert [next(replay), next(replay)] == [(ids[0], {"n": 1}), (ids[1], {"n": 2})]
    assert next(other) == (ids[2], {"n": 3})
    quiet = hub.read_json(second, ids[2], 100)
    assert next(quiet) is None  # block_ms passed with nothing new
    for reader in (live, replay, other, quiet):
        reader.close()


def test_a_new_reader_is_heard_without_waiting_out_the_hubs_xread(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_hub, "BLOCK_MS", 30_000)
    hub, client = hub_for(config)
    first, second = (RedisKeys(config.redis_prefix).request_stream(name) for name in ("a", "b"))
    waiting = hub.read_json(first, STREAM_START, 30_000)
    append_json(client, config, first, {"n": 0})
    next(waiting)  # the hub is now blocked in an XREAD of `first` alone
    newcomer = hub.read_json(second, STREAM_START, 30_000)
    entry_id = append_json(client, config, second, {"n": 1})
    started = time.monotonic()
    assert next(newcomer) == (entry_id, {"n": 1})
    assert time.monotonic() - started < 5
    waiting.close()
    newcomer.close()


def test_a_burst_of_new_readers_wakes_the_hub_once_and_each_is_heard(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_hub, "BLOCK_MS", 30_000)
    hub, client = hub_for(config)
    keys = RedisKeys(config.redis_prefix)
    waiting = hub.read_json(keys.request_stream("first"), STREAM_START, 30_000)
    append_json(client, config, keys.request_stream("first"), {"n": 0})
    next(waiting)  # the hub is now blocked in an XREAD of `first` alone
    # the hub takes the first newcomer's wake and then waits, before it reads again, until all have been added
    gate, woken = threading.Event(), threading.Event()
    deliver = hub._deliver

    def held_deliver(reply: list, readers: list) -> None:
        deliver(reply, readers)
        woken.set()
        gate.wait(10)

    monkeypatch.setattr(hub, "_deliver", held_deliver)
    wake_key = keys.stream_hub_wake("test")
    wakes_before = client.xlen(wake_key)
    newcomers = [hub.read_json(keys.request_stream(f"new-{n}"), STREAM_START, 50) for n in range(8)]
    assert next(newcomers[0]) is None and woken.wait(5)
    for newcomer in newcomers[1:]:
        assert next(newcomer) is None  # added: it waited 50 ms for an entry
    assert client.xlen(wake_key) == wakes_before + 1, "one wake for the eight"
    gate.set()
    entry_ids = [append_json(client, config, keys.request_stream(f"new-{n}"), {"n": n}) for n in range(8)]
    started = time.monotonic()
    for n, newcomer in enumerate(newcomers):
        assert next(item for item in newcomer if item is not None) == (entry_ids[n], {"n": n})
    assert time.monotonic() - started < 5, "heard at once, not after the hub's 30 s XREAD"
    for reader in (waiting, *newcomers):
        reader.close()


def test_a_failed_pass_is_raised_in_every_reader_and_the_next_reader_starts_over(config: Config) -> None:
    hub, client = hub_for(config)
    first, second = (RedisKeys(config.redis_prefix).request_stream(name) for name in ("a", "b"))
    readers = [hub.read_json(key, STREAM_START, 5000) for key in (first, second)]
    for key, reader in zip((first, second), readers, strict=True):
        append_json(client, config, key, {"n": 0})
        next(reader)
    client.delete(second)
    client.set(second, "not a stream")  # the hub's next XREAD is refused: WRONGTYPE
    for reader in readers:
        with pytest.raises(redis.ResponseError):
            next(reader)
    client.delete(second)
    again = hub.read_json(first, STREAM_START, 5000)
    assert next(again)[1] == {"n": 0}  # type: ignore[index]
    again.close()


def test_an_entry_the_hub_cannot_read_fails_its_readers_not_the_hub(config: Config) -> None:
    hub, client = hub_for(config)
    key = RedisKeys(config.redis_prefix).request_stream("a")
    reader = hub.read_json(key, STREAM_START, 5000)
    client.xadd(key, {"not-event": "x"})
    with pytest.raises(redis.RedisError):
        next(reader)
    other = RedisKeys(config.redis_prefix).request_stream("b")
    entry_id = append_json(client, config, other, {"n": 1})
    assert next(hub.read_json(other, STREAM_START, 5000)) == (entry_id, {"n": 1})


def test_an_id_past_redis_range_is_refused_before_it_reaches_the_shared_read(config: Config) -> None:
    hub, _ = hub_for(config)
    with pytest.raises(ValueError, match="range"):
        next(hub.read_json("key", f"{2**64}-0", 1000))
    assert hub._thread is None


def test_a_write_redis_refuses_is_raised_in_the_reader(config: Config) -> None:
    nowhere = redis.Redis(port=free_port(), socket_connect_timeout=0.5, decode_responses=True)
    hub = StreamHub(nowhere, "wake")
    with pytest.raises(redis.RedisError):
        next(hub.read_json("key", STREAM_START, 1000))
    assert not hub._readers


def test_the_thread_ends_after_the_last_reader_and_starts_again_for_the_next(config: Config) -> None:
    hub, client = hub_for(config)
    key = RedisKeys(config.redis_prefix).request_stream("a")
    reader = hub.read_json(key, STREAM_START, 1000)
    append_json(client, config, key, {"n": 0})
    next(reader)
    thread = hub._thread
    assert thread is not None and thread.is_alive()
    reader.close()
    thread.join(10)  # within one XREAD block
    assert not thread.is_alive() and hub._thread is None
    again = hub.read_json(key, STREAM_START, 1000)
    assert next(again)[1] == {"n": 0}  # type: ignore[index]
    again.close()
