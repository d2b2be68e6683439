"""A chat stream that goes quiet after its first frames (a long prefill, a busy worker) reaches the `openai` client's
own Stream whole: its keep-alive comments are not events to it. Its SSE decoder never forgets the last event id, so a
comment followed by a blank line, after any frame with an id, was an event with empty data that it failed to parse
(JSONDecodeError in the middle of the stream)."""

from __future__ import annotations

import uuid
from functools import partial

import httpx2
import openai
import redis
from openai.types.chat import ChatCompletionChunk

from api.chat.relay import relay_frames
from tasks.config import Config
from tasks.messages.generation import Endpoint, EventType, FinishReason, StreamEvent, Usage
from tasks.messages.stream_chunks import StreamMeta
from tasks.streams.events import STREAM_START, append_event, read_entries
from tasks.streams.redis_keys import RedisKeys


def test_the_openai_clients_stream_reads_a_relay_that_went_quiet_between_frames(redis_url: str) -> None:
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:", stream_ttl_s=60)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    meta = StreamMeta("chatcmpl-x", Endpoint.CHAT, "tiny", 1700000000, include_usage=False)
    key = RedisKeys(config.redis_prefix).request_stream("quiet")
    frames = relay_frames(partial(read_entries, client), key, meta, STREAM_START, heartbeat_s=0.1, timeout_s=30)
    sent = [next(frames), next(frames)]  # the admission comment, then a keep-alive before any frame
    append_event(client, config, "quiet", StreamEvent(EventType.START))
    append_event(client, config, "quiet", StreamEvent(EventType.DELTA, text="Hello"))
    while "Hello" not in sent[-1]:  # the frames with ids so far
        sent.append(next(frames))
    sent.append(next(frames))
    assert sent[-1].startswith(": keep-alive"), sent  # the stream is quiet after frames with ids
    final = StreamEvent(EventType.FINAL, finish_reason=FinishReason.STOP, usage=Usage(1, 1))
    append_event(client, config, "quiet", final)
    sent.extend(frames)
    client.delete(key)

    request = httpx2.Request("POST", "http://steerbatch.invalid/v1/chat/completions")
    response = httpx2.Response(200, content="".join(sent).encode(), request=request)
    api = openai.OpenAI(api_key="unused", base_url="http://steerbatch.invalid/v1")
    chunks = list(openai.Stream(cast_to=ChatCompletionChunk, response=response, client=api))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "Hello" and chunks[-1].choices[0].finish_reason == "stop", chunks
