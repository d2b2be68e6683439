"""The output processor on a real Redis and the tiny model's tokenizer, fed engine outputs directly."""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from transformers import PreTrainedTokenizerFast

from tasks.config import Config
from tasks.messages.generation import Endpoint, EventType, FinishReason, GenerateRequest, SamplingParams, StreamEvent
from tasks.messages.steering import SteeringSource
from tasks.messages.stream_chunks import StreamMeta, encode_chunks
from tasks.streams.redis_keys import RedisKeys
from tests.conftest import free_port
from worker.engine.interface import EngineOutput
from worker.serving.metrics import ServingMetrics
from worker.serving.output_processor import FollowedRequest, OutputProcessor, event_json
from worker.text.choice import ENGINE_FAILURE, Choice, engine_request_id
from worker.text.steering_report import SteeringReport
from worker.text.text_stream import TextStream


class CancelRecorder:
    """Stands in for the engine, of which the processor calls only `cancel`."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)


@pytest.fixture
def config(redis_url: str) -> Iterator[Config]:
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:")
    yield config
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


class GatedProcessor(OutputProcessor):
    """Holds each pass at its start until the test opens the gate: to act while a pass runs."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.in_pass = threading.Event()
        self.gate = threading.Event()

    def _process(self, taken: list) -> None:  # type: ignore[type-arg]
        self.in_pass.set()
        self.gate.wait(10)
        super()._process(taken)


@pytest.fixture
def processors() -> Iterator[list[OutputProcessor]]:
    """Processors a test starts, stopped whatever the test's outcome."""
    started: list[OutputProcessor] = []
    yield started
    for processor in started:
        processor.stop()


def start(
    processors: list[OutputProcessor],
    config: Config,
    tokenizer: PreTrainedTokenizerFast,
    kind: type[OutputProcessor] = OutputProcessor,
    engine: CancelRecorder | None = None,
    client: redis.Redis | None = None,
) -> tuple[Any, redis.Redis]:
    """A started processor of `kind` writing through `client` (default: to the test's Redis), and that client."""
    client = client or redis.Redis.from_url(config.redis_url)
    processor = kind(client, config, tokenizer, engine or CancelRecorder(), ServingMetrics())  # type: ignore[arg-type]
    processor.start()
    processors.append(processor)
    return processor, client


def followed_request(
    tokenizer: PreTrainedTokenizerFast, n: int = 1, stop: tuple[str, ...] = (), body: dict | None = None
) -> FollowedRequest:
    """A completion request's choices; with `body` (a streamed request's), the request carries its stream meta."""
    request_id = f"cmpl-{uuid.uuid4().hex}"
    prompt = tokenizer.encode("the cat")
    sampling = SamplingParams(16, stop=stop)
    meta = None if body is None else StreamMeta.of_body(request_id, Endpoint.COMPLETIONS, "tiny", 7, body)
    request = GenerateRequest(request_id, Endpoint.COMPLETIONS, "tiny", prompt, sampling, 7, n=n, stream_meta=meta)
    followed = FollowedRequest(request, SteeringReport(request_id, None, SteeringSource.REQUEST))
    for index in range(n):
        choice_id = engine_request_id(request, index)
        followed.choices[choice_id] = Choice(
            index, choice_id, TextStream(tokenizer, prompt, sampling), wants_logprobs=False
        )
    return followed


def put_during_a_pass(
    processor: GatedProcessor, followed: FollowedRequest, held: EngineOutput, arriving: EngineOutput
) -> None:
    """Follows `followed` and puts `held`, then `arriving` while the pass that took `held` waits at its start."""
    processor.follow(followed)
    processor.put(followed, held)
    assert processor.in_pass.wait(5)
    processor.put(followed, arriving)


def events(client: redis.Redis, config: Config, followed: FollowedRequest) -> list[StreamEvent]:
    key = RedisKeys(config.redis_prefix).request_stream(followed.request.request_id)
    return [StreamEvent.from_dict(json.loads(fields[b"event"])) for _, fields in client.xrange(key)]


def test_outputs_before_and_after_follow_reach_each_stream_in_order(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    processor, client = start(processors, config, tokenizer)
    first, second = followed_request(tokenizer), followed_request(tokenizer, n=2)
    ids = tokenizer.encode(" a small dog", add_special_tokens=False)
    second_ids = list(second.choices)
    processor.put(first, EngineOutput(first.request.request_id, ids[:1]))
    time.sleep(0.2)
    assert events(client, config, first) == []  # held until the request is followed
    processor.follow(first)
    processor.follow(second)
    processor.put(first, EngineOutput(first.request.request_id, ids[1:], FinishReason.LENGTH))
    processor.put(second, EngineOutput(second_ids[1], ids, FinishReason.STOP))
    assert not second.done.wait(0.2)  # choice 0 has not ended
    processor.put(second, EngineOutput(second_ids[0], ids[:2], FinishReason.LENGTH))
    assert first.done.wait(5) and second.done.wait(5)

    assert first.failure is None and first.error is None and first.has_ended
    first_events = events(client, config, first)
    assert first_events and all(event.type == EventType.DELTA for event in first_events)
    assert [token_id for event in first_events for token_id in event.token_ids] == ids
    assert "".join(event.text for event in first_events) == tokenizer.decode(ids)
    second_events = events(client, config, second)
    assert [(event.index, event.finish_reason) for event in second_events] == [(1, FinishReason.STOP), (0, None)]


def test_a_requests_outputs_that_arrive_together_are_one_event(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    processor, client = start(processors, config, tokenizer, GatedProcessor)
    holder, followed = followed_request(tokenizer), followed_request(tokenizer, n=2)
    ids = tokenizer.encode(" a small dog runs", add_special_tokens=False)
    first, second = followed.choices
    processor.follow(followed)
    # while the holder's pass waits, the two choices' outputs queue up, interleaved, for the next pass
    put_during_a_pass(
        processor, holder, EngineOutput(holder.request.request_id, [1]), EngineOutput(holder.request.request_id, [2])
    )
    for token_id in ids:
        processor.put(followed, EngineOutput(first, [token_id]))
        processor.put(followed, EngineOutput(second, [token_id]))
    processor.put(followed, EngineOutput(second, [], FinishReason.LENGTH))
    processor.gate.set()
    assert not followed.done.wait(0.5)  # choice 0 has not ended
    written = events(client, config, followed)
    assert [(event.index, event.token_ids, event.finish_reason) for event in written] == [
        (0, ids, None),
        (1, ids, FinishReason.LENGTH),
    ]
    assert [event.text for event in written] == [tokenizer.decode(ids)] * 2


def test_tokens_between_a_first_token_and_the_end_wait_for_the_stream_interval(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    """A stream's first token and its end go out at once; the tokens between, once per `stream_interval_s`."""
    processor, client = start(processors, dataclasses.replace(config, stream_interval_s=60.0), tokenizer)
    followed = followed_request(tokenizer)
    request_id = followed.request.request_id
    ids = tokenizer.encode(" a small dog runs", add_special_tokens=False)
    processor.follow(followed)
    processor.put(followed, EngineOutput(request_id, ids[:1]))
    assert wait_for_events(client, config, followed, 1)
    for token_id in ids[1:]:
        processor.put(followed, EngineOutput(request_id, [token_id]))
    time.sleep(0.3)
    assert len(events(client, config, followed)) == 1
    processor.put(followed, EngineOutput(request_id, [], FinishReason.LENGTH))
    assert followed.done.wait(10)
    written = events(client, config, followed)
    assert [(event.token_ids, event.text) for event in written] == [
        (ids[:1], tokenizer.decode(ids[:1])),
        (ids[1:], tokenizer.decode(ids)[len(tokenizer.decode(ids[:1])) :]),
    ]


def test_the_pass_interval_grows_past_the_frame_budget_with_the_streams_followed(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    """Streams followed / `stream_max_frames_per_s` when that is longer than `stream_interval_s`; a request counts
    from its `follow` until it is forgotten or ends, once however often either happens."""
    budget = dataclasses.replace(config, stream_interval_s=0.02, stream_max_frames_per_s=100.0)
    processor, _ = start(processors, budget, tokenizer)
    assert processor.pass_interval_s() == 0.02
    requests = [followed_request(tokenizer) for _ in range(5)]
    for followed in requests:
        processor.follow(followed)
    processor.follow(requests[0])
    assert processor.pass_interval_s() == pytest.approx(0.05)
    processor.forget(requests[0])
    processor.forget(requests[0])
    ended = requests[1]
    processor.put(ended, EngineOutput(ended.request.request_id, [], FinishReason.LENGTH))
    assert ended.done.wait(10)
    assert processor.pass_interval_s() == pytest.approx(0.03)
    unbounded, _ = start(processors, dataclasses.replace(budget, stream_max_frames_per_s=0.0), tokenizer)
    for followed in [followed_request(tokenizer) for _ in range(5)]:
        unbounded.follow(followed)
    assert unbounded.pass_interval_s() == 0.02


def test_tokens_between_wait_for_the_frame_budgets_interval_when_it_is_longer(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    """Two streams at a budget of 0.1 frames a second: passes 20 s apart, though `stream_interval_s` is 10 ms; first
    tokens and ends still go out at once."""
    budget = dataclasses.replace(config, stream_interval_s=0.01, stream_max_frames_per_s=0.1)
    processor, client = start(processors, budget, tokenizer)
    requests = [followed_request(tokenizer) for _ in range(2)]
    ids = tokenizer.encode(" a small dog runs", add_special_tokens=False)
    for followed in requests:
        processor.follow(followed)
        processor.put(followed, EngineOutput(followed.request.request_id, ids[:1]))
    assert all(wait_for_events(client, config, followed, 1) for followed in requests)
    for token_id in ids[1:]:
        for followed in requests:
            processor.put(followed, EngineOutput(followed.request.request_id, [token_id]))
    time.sleep(0.3)  # thirty times the stream interval
    assert [len(events(client, config, followed)) for followed in requests] == [1, 1]
    for followed in requests:
        processor.put(followed, EngineOutput(followed.request.request_id, [], FinishReason.LENGTH))
        assert followed.done.wait(10)
        assert [event.token_ids for event in events(client, config, followed)] == [ids[:1], ids[1:]]


def wait_for_events(client: redis.Redis, config: Config, followed: FollowedRequest, count: int) -> bool:
    deadline = time.monotonic() + 10
    while len(events(client, config, followed)) < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_opening_event_goes_out_first_with_the_outputs_waiting_or_alone(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    processor, client = start(processors, config, tokenizer)
    waited, fresh = followed_request(tokenizer), followed_request(tokenizer)
    ids = tokenizer.encode(" a small dog", add_special_tokens=False)
    processor.put(waited, EngineOutput(waited.request.request_id, ids[:1]))  # arrived before the claim allowed it
    processor.follow(waited, opening=StreamEvent(EventType.START))
    processor.follow(fresh, opening=StreamEvent(EventType.START))  # nothing from the engine yet: START alone
    deadline = time.monotonic() + 5
    while not (events(client, config, waited) and events(client, config, fresh)):
        assert time.monotonic() < deadline, "the opening events were not written"
        time.sleep(0.01)
    assert [event.type for event in events(client, config, fresh)] == [EventType.START]
    processor.put(fresh, EngineOutput(fresh.request.request_id, ids, FinishReason.LENGTH))
    processor.put(waited, EngineOutput(waited.request.request_id, ids[1:], FinishReason.LENGTH))
    assert waited.done.wait(5) and fresh.done.wait(5)
    for followed in (waited, fresh):
        written = events(client, config, followed)
        assert written[0].type == EventType.START and {event.type for event in written[1:]} == {EventType.DELTA}
        assert [token_id for event in written for token_id in event.token_ids] == ids
        key = RedisKeys(config.redis_prefix).request_stream(followed.request.request_id)
        assert 0 < client.ttl(key) <= config.stream_ttl_s  # the first entry set the stream's expiry


def test_a_streamed_requests_deltas_carry_the_chunks_its_client_gets_and_others_none(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    processor, client = start(processors, config, tokenizer)
    body = {"stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    streamed, unstreamed = followed_request(tokenizer, body=body), followed_request(tokenizer)
    ids = tokenizer.encode(" a small dog", add_special_tokens=False)
    for followed in (streamed, unstreamed):
        processor.follow(followed)
        processor.put(followed, EngineOutput(followed.request.request_id, ids[:1]))
        processor.put(followed, EngineOutput(followed.request.request_id, ids[1:], FinishReason.LENGTH))
        assert followed.done.wait(5) and followed.failure is None

    key = RedisKeys(config.redis_prefix).request_stream(streamed.request.request_id)
    entries = [fields for _, fields in client.xrange(key)]
    assert entries and all(b"chunks" in fields for fields in entries)
    meta = streamed.request.stream_meta
    assert meta is not None and meta.include_usage and meta.return_token_ids
    for fields in entries:
        event = StreamEvent.from_dict(json.loads(fields[b"event"]))
        assert fields[b"chunks"].decode() == encode_chunks(meta, event)
        chunk = json.loads(fields[b"chunks"])  # a DELTA: one chunk, its ids and text in the client's shape
        assert chunk["id"] == streamed.request.request_id and chunk["object"] == "text_completion"
        assert chunk["choices"][0]["token_ids"] == event.token_ids and chunk["choices"][0]["text"] == event.text
    other = RedisKeys(config.redis_prefix).request_stream(unstreamed.request.request_id)
    unstreamed_entries = [set(fields) for _, fields in client.xrange(other)]
    assert unstreamed_entries and all(fields == {b"event"} for fields in unstreamed_entries)


def test_an_events_json_is_what_its_dict_encodes_to() -> None:
    """The output processor writes a token's DELTA without `to_dict`; readers decode it as they decode any event."""
    deltas = [
        StreamEvent(EventType.DELTA, text=text, token_ids=token_ids, index=index, text_offset=offset)
        for text, token_ids, index, offset in itertools.product(("", ' \u00e9"\n'), ([], [3, 4]), (0, 1), (0, 9))
    ]
    others = [
        StreamEvent(EventType.DELTA, text="a", finish_reason=FinishReason.STOP, index=1),
        StreamEvent(EventType.DELTA, text="a", logprobs=[{"token": "a", "logprob": -0.5}]),
        StreamEvent(EventType.FINAL, finish_reason=FinishReason.LENGTH),
        StreamEvent(EventType.START),
    ]
    for event in deltas + others:
        assert event_json(event) == json.dumps(event.to_dict()), event


def test_a_stop_string_ends_the_choice_and_cancels_it_in_the_engine(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    engine = CancelRecorder()
    processor, client = start(processors, config, tokenizer, engine=engine)
    followed = followed_request(tokenizer, stop=("dog",))
    processor.follow(followed)
    for token_id in tokenizer.encode(" a small dog runs", add_special_tokens=False):
        processor.put(followed, EngineOutput(followed.request.request_id, [token_id]))
    assert followed.done.wait(5)
    assert engine.cancelled == [followed.request.request_id]
    assert "".join(event.text for event in events(client, config, followed)) == " a small "


def test_an_engine_error_ends_the_request_without_its_internals(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    processor, _ = start(processors, config, tokenizer)
    followed = followed_request(tokenizer, n=2)
    processor.follow(followed)
    processor.put(followed, EngineOutput(list(followed.choices)[1], [], error="step failed in /opt/kernels/x.so"))
    assert followed.done.wait(5)
    assert followed.error is not None and followed.error.message == ENGINE_FAILURE  # the log has the engine's text
    assert followed.error.type == "server_error"
    assert followed.failure is None


def test_forget_returns_after_the_running_pass_and_nothing_is_written_after_it(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    processor, client = start(processors, config, tokenizer, GatedProcessor)
    followed = followed_request(tokenizer)
    a, b = (tokenizer.encode(text, add_special_tokens=False) for text in (" a", " b"))
    request_id = followed.request.request_id
    put_during_a_pass(processor, followed, EngineOutput(request_id, a), EngineOutput(request_id, b))
    forgetting = threading.Thread(target=processor.forget, args=(followed,))
    forgetting.start()
    forgetting.join(0.2)
    assert forgetting.is_alive()  # waits for the pass that holds the request's outputs
    processor.gate.set()
    forgetting.join(5)
    written = events(client, config, followed)
    assert [event.text for event in written] == [" a"]
    processor.put(followed, EngineOutput(followed.request.request_id, [1], FinishReason.LENGTH))
    time.sleep(0.2)
    assert events(client, config, followed) == written and not followed.done.is_set()


def test_outputs_that_arrive_while_a_request_ends_are_never_written(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    processor, client = start(processors, config, tokenizer, GatedProcessor)
    followed = followed_request(tokenizer, n=2)
    first, second = followed.choices
    failed = EngineOutput(second, [], error="the engine step failed")
    still_running = EngineOutput(first, tokenizer.encode(" a", add_special_tokens=False))
    put_during_a_pass(processor, followed, failed, still_running)
    processor.gate.set()
    assert followed.done.wait(5)
    processor.forget(followed)  # the handler's, before it writes the FINAL event
    time.sleep(0.2)
    assert events(client, config, followed) == []


def test_one_requests_bad_output_fails_only_that_request(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    processor, client = start(processors, config, tokenizer, GatedProcessor)
    holder, broken, healthy = (followed_request(tokenizer) for _ in range(3))
    processor.follow(broken)
    processor.follow(healthy)
    # while the holder's pass waits, both outputs queue up, so the next pass takes them together
    put_during_a_pass(
        processor, holder, EngineOutput(holder.request.request_id, [1]), EngineOutput(holder.request.request_id, [2])
    )
    processor.put(broken, EngineOutput("not-one-of-its-choices", [1]))
    processor.put(healthy, EngineOutput(healthy.request.request_id, [1], FinishReason.LENGTH))
    processor.gate.set()
    assert broken.done.wait(5) and healthy.done.wait(5)
    assert isinstance(broken.failure, KeyError) and healthy.failure is None
    assert len(events(client, config, healthy)) == 1 and processor.is_alive()


def test_stop_writes_what_has_arrived_first(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    processor, _ = start(processors, config, tokenizer, GatedProcessor)
    followed = followed_request(tokenizer)
    request_id = followed.request.request_id
    put_during_a_pass(
        processor, followed, EngineOutput(request_id, [1]), EngineOutput(request_id, [], FinishReason.ABORT)
    )
    processor.stop()
    processor.gate.set()
    assert followed.done.wait(5)
    assert next(iter(followed.choices.values())).finish_reason == FinishReason.ABORT


def test_events_redis_refuses_fail_their_requests(
    config: Config, tokenizer: PreTrainedTokenizerFast, processors: list[OutputProcessor]
) -> None:
    nowhere = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    processor, _ = start(processors, config, tokenizer, client=nowhere)
    followed = followed_request(tokenizer)
    processor.follow(followed)
    processor.put(followed, EngineOutput(followed.request.request_id, tokenizer.encode(" a", add_special_tokens=False)))
    assert followed.done.wait(10)
    assert isinstance(followed.failure, redis.RedisError) and processor.is_alive()
