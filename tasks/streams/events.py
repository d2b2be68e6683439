"""Request and batch streams in Redis: the worker appends JSON events, the api and waiting workers read and follow
them to the final one.

An entry's `event` field is the event's JSON. A DELTA of a streamed chat or completion request also has a `chunks`
field: the SSE payloads the client gets for it (tasks/messages/stream_chunks.py), which the api's relay forwards as
they are (read through an `EntryReader`, which hands over entries undecoded)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator

import redis

from tasks.config import Config
from tasks.messages.generation import EventType, StreamEvent
from tasks.streams.redis_keys import RedisKeys

STREAM_START = "0-0"
ENTRIES_PER_READ = 256  # of one stream, by one XREAD
MAX_ENTRY_PART = 2**64 - 1  # both parts of a stream entry id are unsigned 64-bit integers
# (key, after_id, block_ms) -> the JSON events after after_id, None each block_ms with none: read_json with its
# client bound, or the api's StreamHub.read_json
JsonReader = Callable[[str, str, int], Iterator[tuple[str, dict] | None]]
# (key, after_id, block_ms) -> the entries after after_id as Redis has them, (entry id, fields), in batches of those
# that arrived together; None each block_ms with none: read_entries with its client bound, or StreamHub.read_entries
Entry = tuple[str, dict[str, str]]
EntryReader = Callable[[str, str, int], Iterator[list[Entry] | None]]
EVENT_FIELD = "event"
CHUNKS_FIELD = "chunks"


def append_event(client: redis.Redis, config: Config, request_id: str, event: StreamEvent) -> str:
    return append_json(client, config, RedisKeys(config.redis_prefix).request_stream(request_id), event.to_dict())


def append_json(client: redis.Redis, config: Config, key: str, event: dict) -> str:
    """XADD one JSON event to a bounded stream that expires `stream_ttl_s` after its last entry."""
    [entry_id] = append_json_many(client, config, key, [event])
    return entry_id


def append_json_many(client: redis.Redis, config: Config, key: str, events: list[dict]) -> list[str]:
    """`append_json` for several events in one round trip, in order."""
    return append_json_to_streams(client, config, [(key, event) for event in events])


def append_json_to_streams(
    client: redis.Redis, config: Config, entries: list[tuple[str, dict]], expire_keys: Iterable[str] | None = None
) -> list[str]:
    """`append_json` for (stream key, event) pairs of any number of streams, in one round trip and one transaction;
    each stream gets its events in the order given and its expiry set once. `expire_keys`: only these streams' expiry
    is set (a writer that renews each stream's expiry itself, well before it runs out, saves a command an event)."""
    encoded = [(key, {EVENT_FIELD: json.dumps(event)}) for key, event in entries]
    return append_entries_to_streams(client, config, encoded, expire_keys)


# Every entry of a pass, and the expiries asked for, in one command: atomic as MULTI/EXEC is (a refused command stops
# the rest, and nothing is rolled back), and one command for redis-py to pack and one reply to parse instead of a
# QUEUED and an id per entry (client CPU for a pass of 32 DELTAs: about 80 us against 280 us with MULTI/EXEC).
# KEYS: each entry's stream, then the streams whose expiry to set. ARGV: the number of entries, MAXLEN, the TTL in
# seconds, then each entry as its number of field and value strings followed by them.
APPEND_ENTRIES = """
local num_entries, maxlen, ttl = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local ids, at = {}, 4
for i = 1, num_entries do
  local size = tonumber(ARGV[at])
  local command = {'XADD', KEYS[i], 'MAXLEN', '~', maxlen, '*'}
  for j = 1, size do command[6 + j] = ARGV[at + j] end
  ids[i] = redis.call(unpack(command))
  at = at + size + 1
end
for i = num_entries + 1, #KEYS do redis.call('EXPIRE', KEYS[i], ttl) end
return ids
"""
APPEND_ENTRIES_SHA = hashlib.sha1(APPEND_ENTRIES.encode()).hexdigest()


def append_entries_to_streams(
    client: redis.Redis,
    config: Config,
    entries: list[tuple[str, dict[str, str]]],
    expire_keys: Iterable[str] | None = None,
) -> list[str]:
    """`append_json_to_streams` for entries whose fields are already encoded."""
    if expire_keys is None:
        expire_keys = dict.fromkeys(key for key, _ in entries)
    args: list[str | int] = [len(entries), config.stream_maxlen, config.stream_ttl_s]
    for _, fields in entries:
        args.append(2 * len(fields))
        for name, value in fields.items():
            args += (name, value)
    keys = [key for key, _ in entries] + list(expire_keys)
    try:
        entry_ids = client.evalsha(APPEND_ENTRIES_SHA, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:  # a Redis that has not run it since it started: EVAL caches it
        entry_ids = client.eval(APPEND_ENTRIES, len(keys), *keys, *args)
    return [_text(entry_id) for entry_id in entry_ids]


# XADD the final event unless the stream already ends in one: atomic in Redis, so a worker finishing a request and
# an api closing the stream of a request already finished in SQL (its worker's XADD lost to a Redis crash) never
# write two. KEYS[1]: the stream; ARGV: the event's JSON, its type, MAXLEN, the stream's TTL in seconds.
APPEND_FINAL_ONCE = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
if last and last[2][1] == 'event' and cjson.decode(last[2][2])['type'] == ARGV[2] then return false end
local entry_id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'event', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return entry_id
"""


APPEND_FINAL_ONCE_SHA = hashlib.sha1(APPEND_FINAL_ONCE.encode()).hexdigest()


def append_final_once(client: redis.Redis, config: Config, request_id: str, event: StreamEvent) -> str | None:
    """The request's final event, unless its stream already ends in one; its entry id, or None."""
    key = RedisKeys(config.redis_prefix).request_stream(request_id)
    entry_id = client.eval(APPEND_FINAL_ONCE, 1, key, *_final_once_args(config, event))
    return None if entry_id is None else _text(entry_id)


def append_finals_once(client: redis.Redis, config: Config, finals: list[tuple[str, StreamEvent]]) -> None:
    """`append_final_once` for each (request id, final event), in one round trip (two the first time a Redis runs it:
    a script that is not loaded fails every call alike, and a final event is written once however often it is sent)."""
    if not finals:
        return
    keys = RedisKeys(config.redis_prefix)
    calls = [(keys.request_stream(request_id), _final_once_args(config, event)) for request_id, event in finals]
    for attempt in range(2):
        try:
            with client.pipeline(transaction=False) as pipe:
                for key, args in calls:
                    pipe.evalsha(APPEND_FINAL_ONCE_SHA, 1, key, *args)
                pipe.execute()
            return
        except redis.exceptions.NoScriptError:
            if attempt:
                raise
            client.script_load(APPEND_FINAL_ONCE)


def _final_once_args(config: Config, event: StreamEvent) -> tuple[str, str, int, int]:
    """APPEND_FINAL_ONCE's ARGV for `event`."""
    return json.dumps(event.to_dict()), EventType.FINAL.value, config.stream_maxlen, config.stream_ttl_s


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


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
            yield entry_id, entry_json(fields)


def entry_json(fields: dict[str, str]) -> dict:
    """An entry's event as JSON; a RedisError for an entry no writer of ours made, which its reader cannot follow."""
    try:
        return json.loads(fields[EVENT_FIELD])
    except (KeyError, ValueError) as exc:
        raise redis.RedisError(f"a stream entry without a readable event: {sorted(fields)}") from exc


def read_entries(client: redis.Redis, key: str, after_id: str, block_ms: int) -> Iterator[list[Entry] | None]:
    """`read_json`'s entries undecoded, each XREAD's as one batch: an `EntryReader`."""
    while True:
        reply = client.xread({key: after_id}, count=ENTRIES_PER_READ, block=block_ms)
        if not reply:
            yield None
            continue
        entries = reply[0][1]
        after_id = entries[-1][0]
        yield entries


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
