"""The chat relay forwards the payloads a DELTA entry carries as the worker wrote them, makes the other entries'
chunks itself, and sends the frames of the entries one read brings in one write; the stream meta the worker writes
them with crosses Celery intact."""

from __future__ import annotations

import itertools
import json
import uuid
from functools import partial

import pytest
import redis

from api.chat.relay import relay_frames
from tasks.config import Config
from tasks.messages.generation import Endpoint, EventType, FinishReason, GenerateRequest, SamplingParams, StreamEvent
from tasks.messages.stream_chunks import StreamMeta, encode_chunks, stream_chunks
from tasks.streams.events import STREAM_START, append_entries_to_streams, append_event, read_entries
from tasks.streams.redis_keys import RedisKeys


def test_delta_payloads_go_out_as_written_and_one_reads_frames_in_one_write(redis_url: str) -> None:
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:", stream_ttl_s=60)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    meta = StreamMeta("cmpl-x", Endpoint.COMPLETIONS, "tiny", 1700000000, include_usage=False)
    key = RedisKeys(config.redis_prefix).request_stream("r")
    delta = StreamEvent(EventType.DELTA, text="a", token_ids=[5])
    # payloads the relay could not have made from the event: the relay must have forwarded them
    written = [json.dumps({"written": n}) for n in range(2)]
    append_entries_to_streams(
        client, config, [(key, {"event": json.dumps(delta.to_dict()), "chunks": "\n".join(written)})]
    )
    append_event(client, config, "r", StreamEvent(EventType.DELTA, text="b"))  # no payloads: made by the relay
    append_event(client, config, "r", StreamEvent(EventType.FINAL, finish_reason=FinishReason.STOP))

    writes = list(relay_frames(partial(read_entries, client), key, meta, STREAM_START, heartbeat_s=5, timeout_s=30))
    client.delete(key)
    assert writes[0] == ": admitted\n"
    assert len(writes) == 2, writes  # every entry was in Redis before the first read: one write
    data = [line[len("data: ") :] for line in writes[1].split("\n") if line.startswith("data: ")]
    made = [json.dumps(chunk) for chunk in json.loads("[" + ",".join(data[2:4]) + "]")]
    assert data[:2] == written and json.loads(data[2])["choices"][0]["text"] == "b"
    assert made[1] == encode_chunks(meta, StreamEvent(EventType.FINAL, finish_reason=FinishReason.STOP))
    assert data[-1] == "[DONE]"


def test_the_stream_meta_crosses_celery_in_the_request() -> None:
    meta = StreamMeta.of_body(
        "chatcmpl-x",
        Endpoint.CHAT,
        "tiny",
        1700000000,
        {"stream_options": {"include_usage": True}, "return_token_ids": True, "functions": []},
    )
    request = GenerateRequest("chatcmpl-x", Endpoint.CHAT, "tiny", [1, 2], SamplingParams(4), 1700000000)
    for sent in (request, GenerateRequest(**{**request.__dict__, "stream_meta": meta})):
        assert GenerateRequest.from_dict(json.loads(json.dumps(sent.to_dict()))) == sent
    assert meta.include_usage and meta.return_token_ids and meta.is_legacy_functions


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_a_tokens_encoded_chunk_is_the_general_paths_text(endpoint: Endpoint) -> None:
    """The worker encodes a plain DELTA's chunk from a cached envelope; it must be what the chunk dict encodes to."""
    for include_usage, return_token_ids, index, text, token_ids in itertools.product(
        (False, True), (False, True), (0, 2), ("", ' w\u00e9"\n</s>'), ([], [5, 6])
    ):
        meta = StreamMeta("x-1", endpoint, "tiny", 1700000000, include_usage, return_token_ids=return_token_ids)
        event = StreamEvent(EventType.DELTA, text=text, token_ids=token_ids, index=index)
        general = "\n".join(json.dumps(chunk) for chunk in stream_chunks(meta, event))
        assert encode_chunks(meta, event) == general, (meta, event)
