"""Redis keys and stream helpers shared by the worker (writes events) and the api (relays them)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import redis

from tasks.config import Config
from tasks.messages import EventType, StreamEvent

STREAM_START = "0-0"
ENTRIES_PER_READ = 256  # of one stream, by one XREAD
MAX_ENTRY_PART = 2**64 - 1  # both parts of a stream entry id are unsigned 64-bit integers
# (key, after_id, block_ms) -> the JSON events after after_id, None each block_ms with none: read_json with its
# client bound, or the api's StreamHub.read_json
JsonReader = Callable[[str, str, int], Iterator[tuple[str, dict] | None]]


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


def connect_redis(config: Config, *, block_s: float = 0.0) -> redis.Redis:
    """A client whose reads outlast the longest XREAD block we issue."""
    return redis.Redis.from_url(
        config.redis_url,
        decode_responses=True,
        socket_connect_timeout=2,
        socket_timeout=block_s + 10,
        health_check_interval=30,
    )


def append_event(client: redis.Redis, config: Config, request_id: str, event: StreamEvent) -> str:
    return append_json(client, config, RedisKeys(config.redis_prefix).request_stream(request_id), event.to_dict())


def append_json(client: redis.Redis, config: Config, key: str, event: dict) -> str:
    """XADD one JSON event to a bounded stream that expires `stream_ttl_s` after its last entry."""
    [entry_id] = append_json_many(client, config, key, [event])
    return entry_id


def append_json_many(client: redis.Redis, config: Config, key: str, events: list[dict]) -> list[str]:
    """`append_json` for several events in one round trip, in order."""
    return append_json_to_streams(client, config, [(key, event) for event in events])


def append_json_to_streams(client: redis.Redis, config: Config, entries: list[tuple[str, dict]]) -> list[str]:
    """`append_json` for (stream key, event) pairs of any number of streams, in one round trip and one transaction;
    each stream gets its events in the order given and its expiry set once."""
    pipe = client.pipeline(transaction=True)
    for key, event in entries:
        pipe.xadd(key, {"event": json.dumps(event)}, maxlen=config.stream_maxlen, approximate=True)
    for key in dict.fromkeys(key for key, _ in entries):
        pipe.expire(key, config.stream_ttl_s)
    return [str(entry_id) for entry_id in pipe.execute()[: len(entries)]]


def read_events(read: JsonReader, key: str, after_id: str, block_ms: int) -> Iterator[tuple[str, StreamEvent] | None]:
    """Entries after `after_id` as they arrive, for ever; None each time `block_ms` passes with none."""
    for item in read(key, after_id, block_ms):
        yield None if item is None else (item[0], StreamEvent.from_dict(item[1]))


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("<milliseconds>-<sequence>") as a sortable pair; ValueError if Redis would refuse it."""
    milliseconds, sequence = (int(part) for part in entry_id.split("-"))
    if not (0 <= milliseconds <= MAX_ENTRY_PART and 0 <= sequence <= MAX_ENTRY_PART):
        raise ValueError(f"{entry_id!r} is outside Redis's range of stream entry ids")
    return milliseconds, sequence


def entry_before(entry_id: str) -> str:
    """The greatest id below `entry_id` (STREAM_START for itself): reading after it starts at `entry_id`."""
    milliseconds, sequence = entry_order(entry_id)
    if sequence > 0:
        return f"{milliseconds}-{sequence - 1}"
    if milliseconds > 0:
        return f"{milliseconds - 1}-{MAX_ENTRY_PART}"
    return STREAM_START


def read_json(client: redis.Redis, key: str, after_id: str, block_ms: int) -> Iterator[tuple[str, dict] | None]:
    """The JSON events of `append_json` after `after_id`, for ever; None each time `block_ms` passes with none."""
    while True:
        reply = client.xread({key: after_id}, count=ENTRIES_PER_READ, block=block_ms)
        if not reply:
            yield None
            continue
        for entry_id, fields in reply[0][1]:
            after_id = entry_id
            yield entry_id, json.loads(fields["event"])


class DeadlinePassed(Exception):
    """The stream did not reach its final event in time."""


def follow_events(
    read: JsonReader,
    key: str,
    after_id: str,
    *,
    idle_s: float,
    timeout_s: float,
    on_idle: Callable[[], object] = lambda: None,
) -> Iterator[tuple[str, StreamEvent] | None]:
    """Entries after `after_id` through the final one; None after each quiet `idle_s`, once `on_idle` has run.

    Raises DeadlinePassed when `timeout_s` runs out first (noticed within `idle_s`)."""
    deadline = time.monotonic() + timeout_s
    for item in read_events(read, key, after_id, int(idle_s * 1000)):
        if time.monotonic() >= deadline:
            raise DeadlinePassed(key)
        if item is None:
            on_idle()
        yield item
        if item is not None and item[1].type == EventType.FINAL:
            return


def wait_for_final(
    read: JsonReader,
    key: str,
    *,
    idle_s: float,
    timeout_s: float,
    on_idle: Callable[[], object] = lambda: None,
    on_tick: Callable[[], object] = lambda: None,
) -> StreamEvent | None:
    """The request's final event; None if `timeout_s` passes first. `on_idle` runs after each quiet `idle_s`;
    `on_tick` about every `idle_s` whether events flow or not."""
    last_tick = time.monotonic()
    try:
        for item in follow_events(read, key, STREAM_START, idle_s=idle_s, timeout_s=timeout_s, on_idle=on_idle):
            if item is not None and item[1].type == EventType.FINAL:
                return item[1]
            if time.monotonic() - last_tick >= idle_s:
                on_tick()
                last_tick = time.monotonic()
    except DeadlinePassed:
        return None
    raise AssertionError("follow_events ends only at the final event")


def request_cancel(client: redis.Redis, config: Config, request_id: str) -> None:
    client.set(RedisKeys(config.redis_prefix).cancel_flag(request_id), "1", ex=config.stream_ttl_s)


def is_cancel_requested(client: redis.Redis, config: Config, request_id: str) -> bool:
    return bool(client.exists(RedisKeys(config.redis_prefix).cancel_flag(request_id)))


def read_cancel_flags(client: redis.Redis, config: Config, request_ids: list[str]) -> set[str]:
    """The requests of `request_ids` whose client asked to cancel, in one round trip."""
    keys = RedisKeys(config.redis_prefix)
    values = client.mget([keys.cancel_flag(request_id) for request_id in request_ids])
    return {request_id for request_id, value in zip(request_ids, values, strict=True) if value}


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
    keys = RedisKeys(config.redis_prefix)
    registry = keys.live_workers() if model is None else keys.live_workers_of(model)
    return int(client.zcount(registry, time.time(), "+inf"))


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
