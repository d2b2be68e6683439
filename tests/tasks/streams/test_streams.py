"""Stream helpers on a real Redis: ordered entries, resume by id (from any frame of the relay), bounded length,
expiry, heartbeats."""

from __future__ import annotations

import time
import uuid
from functools import partial

import redis

from api.chat.relay import relay_frames
from tasks.config import Config
from tasks.messages.generation import Endpoint, EventType, FinishReason, StreamEvent, Usage
from tasks.messages.stream_chunks import StreamMeta
from tasks.streams.events import (
    STREAM_START,
    append_event,
    append_final_once,
    append_json_many,
    append_json_to_streams,
    read_entries,
    read_events,
    read_json,
    wait_for_final,
)
from tasks.streams.redis_keys import RedisKeys


def make_config(redis_url: str) -> Config:
    return Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:", stream_maxlen=100, stream_ttl_s=60)


def test_a_final_event_is_appended_once_whoever_writes_it(redis_url: str) -> None:
    config = make_config(redis_url)
    client = redis.Redis.from_url(redis_url)  # bytes replies, as the worker's client has
    final = StreamEvent(EventType.FINAL, finish_reason=FinishReason.STOP)
    assert append_final_once(client, config, "r1", final) is not None  # a stream Redis lost: it starts with it
    append_event(client, config, "r2", StreamEvent(EventType.DELTA, text="a"))
    first = append_final_once(client, config, "r2", final)
    assert first is not None and append_final_once(client, config, "r2", final) is None
    key = RedisKeys(config.redis_prefix).request_stream("r2")
    assert [entry_id.decode() for entry_id, _ in client.xrange(key)][-1] == first and client.xlen(key) == 2
    assert 0 < client.ttl(key) <= 60


def test_events_read_back_in_order_and_resume_after_an_id(redis_url: str) -> None:
    config = make_config(redis_url)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    ids = [append_event(client, config, "r1", StreamEvent(EventType.DELTA, text=str(i))) for i in range(5)]
    append_event(client, config, "r1", StreamEvent(EventType.FINAL, finish_reason=FinishReason.STOP))
    key = RedisKeys(config.redis_prefix).request_stream("r1")
    after_second = read_events(partial(read_json, client), key, ids[1], block_ms=100)
    assert [next(after_second)[1].text for _ in range(3)] == ["2", "3", "4"]  # type: ignore[index]
    assert 0 < client.ttl(key) <= 60
    final = wait_for_final(partial(read_json, client), key, idle_s=0.1, timeout_s=1)
    assert final is not None and final.finish_reason == FinishReason.STOP
    client.delete(key)


def test_several_events_go_in_one_round_trip_in_order(redis_url: str) -> None:
    config = make_config(redis_url)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    key = RedisKeys(config.redis_prefix).batch_stream("b1")
    ids = append_json_many(client, config, key, [{"n": 1}, {"n": 2}, {"n": 3}])
    entries = read_json(client, key, STREAM_START, block_ms=100)
    assert [next(entries) for _ in range(3)] == [(ids[0], {"n": 1}), (ids[1], {"n": 2}), (ids[2], {"n": 3})]
    assert 0 < client.ttl(key) <= 60
    client.delete(key)


def test_events_of_several_streams_go_in_one_round_trip_each_stream_in_order(redis_url: str) -> None:
    config = make_config(redis_url)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    first, second = (RedisKeys(config.redis_prefix).request_stream(name) for name in ("a", "b"))
    entries = [(first, {"n": 1}), (second, {"n": 2}), (first, {"n": 3})]
    ids = append_json_to_streams(client, config, entries)
    assert len(ids) == 3
    assert [item for item, _ in zip(read_json(client, first, STREAM_START, 100), range(2), strict=False)] == [
        (ids[0], {"n": 1}),
        (ids[2], {"n": 3}),
    ]
    assert next(read_json(client, second, STREAM_START, 100)) == (ids[1], {"n": 2})
    assert 0 < client.ttl(first) <= 60 and 0 < client.ttl(second) <= 60
    client.delete(first, second)


def test_stream_length_is_bounded(redis_url: str) -> None:
    config = make_config(redis_url)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    for i in range(1000):
        append_event(client, config, "long", StreamEvent(EventType.DELTA, text=str(i)))
    key = RedisKeys(config.redis_prefix).request_stream("long")
    assert client.xlen(key) < 300  # MAXLEN ~100 trims whole macro-nodes, so "about" 100
    client.delete(key)


def test_relay_sends_heartbeats_while_idle_then_the_events(redis_url: str) -> None:
    config = make_config(redis_url)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    meta = StreamMeta("cmpl-x", Endpoint.COMPLETIONS, "tiny", 1700000000, include_usage=False)
    key = RedisKeys(config.redis_prefix).request_stream("idle")
    frames = relay_frames(partial(read_entries, client), key, meta, STREAM_START, heartbeat_s=0.2, timeout_s=30)
    assert next(frames) == ": admitted\n"  # at once: the response's headers go out with it
    assert next(frames) == ": keep-alive\n"
    append_event(client, config, "idle", StreamEvent(EventType.DELTA, text="hi"))
    append_event(
        client, config, "idle", StreamEvent(EventType.FINAL, finish_reason=FinishReason.STOP, usage=Usage(1, 1))
    )
    rest = list(frames)
    assert '"text": "hi"' in rest[0] and rest[-1].endswith("data: [DONE]\n\n")
    client.delete(key)


def parse_frame(frame: str) -> tuple[str | None, str | None, str | None]:
    """(retry, id, data) of one SSE block; all None for a comment."""
    fields = dict(line.split(": ", 1) for line in frame.strip("\n").split("\n") if not line.startswith(":"))
    return fields.get("retry"), fields.get("id"), fields.get("data")


def test_every_frame_has_an_id_to_resume_from_that_loses_and_repeats_nothing(redis_url: str) -> None:
    config = make_config(redis_url)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    meta = StreamMeta("chatcmpl-x", Endpoint.CHAT, "tiny", 1700000000, include_usage=True)
    events = [StreamEvent(EventType.START), StreamEvent(EventType.DELTA, text="a"),
              StreamEvent(EventType.DELTA, text="b"),
              StreamEvent(EventType.FINAL, finish_reason=FinishReason.LENGTH, usage=Usage(3, 2))]  # fmt: skip
    for event in events:
        append_event(client, config, "r", event)
    key = RedisKeys(config.redis_prefix).request_stream("r")

    def relay(after_id: str) -> list[tuple[str | None, str | None, str | None]]:
        frames = relay_frames(partial(read_entries, client), key, meta, after_id, heartbeat_s=5, timeout_s=30)
        blocks = [block for written in frames for block in written.split("\n\n") if block.strip()]
        return [parsed for parsed in map(parse_frame, blocks) if parsed[2] is not None]

    original = relay(STREAM_START)
    assert [data for _, _, data in original][-1] == "[DONE]" and len(original) == 6  # role, a, b, finish, usage, done
    assert original[0][0] == "1000" and all(retry is None for retry, _, _ in original[1:])
    assert all(event_id for _, event_id, _ in original), "every frame carries an id"
    for index, (_, event_id, _) in enumerate(original[:-1]):
        assert [data for _, _, data in relay(event_id)] == [data for _, _, data in original[index + 1 :]], event_id
    started = time.monotonic()
    done_id = original[-1][1]
    assert relay(done_id) == [("1000", done_id, "[DONE]")]  # after the final entry, [DONE] at once
    assert time.monotonic() - started < 2
    client.delete(key)
