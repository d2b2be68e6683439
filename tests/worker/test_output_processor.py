"""The output processor on a real Redis and the tiny model's tokenizer, fed engine outputs directly."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from transformers import PreTrainedTokenizerFast

from tasks.config import Config
from tasks.messages import Endpoint, EventType, FinishReason, GenerateRequest, SamplingParams, StreamEvent
from tasks.streams import RedisKeys
from tests.conftest import free_port
from worker.choice import Choice
from worker.engine import EngineOutput
from worker.output_processor import FollowedRequest, OutputProcessor
from worker.steering_report import REQUEST, SteeringReport
from worker.text_stream import TextStream


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


def followed_request(tokenizer: PreTrainedTokenizerFast, n: int = 1, stop: tuple[str, ...] = ()) -> FollowedRequest:
    request_id = f"cmpl-{uuid.uuid4().hex}"
    prompt = tokenizer.encode("the cat")
    request = GenerateRequest(request_id, Endpoint.COMPLETIONS, "tiny", prompt, SamplingParams(16, stop=stop), 0, n=n)
    followed = FollowedRequest(request, SteeringReport(request_id, None, REQUEST))
    for index in range(n):
        choice_id = request_id if n == 1 else f"{request_id}#{index}"
        followed.choices[choice_id] = Choice(
            index, choice_id, TextStream(tokenizer, prompt, stop), wants_logprobs=False
        )
    return followed


def events(client: redis.Redis, config: Config, followed: FollowedRequest) -> list[StreamEvent]:
    key = RedisKeys(config.redis_prefix).request_stream(followed.request.request_id)
    return [StreamEvent.from_dict(json.loads(fields[b"event"])) for _, fields in client.xrange(key)]


def test_outputs_before_and_after_follow_reach_each_stream_in_order(
    config: Config, tokenizer: PreTrainedTokenizerFast
) -> None:
    client = redis.Redis.from_url(config.redis_url)
    processor = OutputProcessor(client, config, tokenizer, CancelRecorder())  # type: ignore[arg-type]
    processor.start()
    first, second = followed_request(tokenizer), followed_request(tokenizer, n=2)
    ids = tokenizer.encode(" a small dog", add_special_tokens=False)
    second_ids = list(second.choices)
    processor.put(first, EngineOutput(first.request.request_id, ids[:1]))  # before follow: held until then
    processor.follow(first)
    processor.follow(second)
    processor.put(first, EngineOutput(first.request.request_id, ids[1:], FinishReason.LENGTH))
    processor.put(second, EngineOutput(second_ids[1], ids, FinishReason.STOP))
    assert not second.done.wait(0.2)  # choice 0 has not ended
    processor.put(second, EngineOutput(second_ids[0], ids[:2], FinishReason.LENGTH))
    assert first.done.wait(5) and second.done.wait(5)
    processor.stop()

    assert first.failure is None and first.error is None and first.has_ended
    first_events = events(client, config, first)
    assert [event.type for event in first_events] == [EventType.DELTA, EventType.DELTA]
    assert [token_id for event in first_events for token_id in event.token_ids] == ids
    assert "".join(event.text for event in first_events) == tokenizer.decode(ids)
    second_events = events(client, config, second)
    assert [(event.index, event.finish_reason) for event in second_events] == [(1, FinishReason.STOP), (0, None)]


def test_a_stop_string_ends_the_choice_and_cancels_it_in_the_engine(
    config: Config, tokenizer: PreTrainedTokenizerFast
) -> None:
    client = redis.Redis.from_url(config.redis_url)
    engine = CancelRecorder()
    processor = OutputProcessor(client, config, tokenizer, engine)  # type: ignore[arg-type]
    processor.start()
    followed = followed_request(tokenizer, stop=("dog",))
    processor.follow(followed)
    for token_id in tokenizer.encode(" a small dog runs", add_special_tokens=False):
        processor.put(followed, EngineOutput(followed.request.request_id, [token_id]))
    assert followed.done.wait(5)
    processor.stop()
    assert engine.cancelled == [followed.request.request_id]
    assert "".join(event.text for event in events(client, config, followed)) == " a small "


def test_a_forgotten_request_writes_nothing_more(config: Config, tokenizer: PreTrainedTokenizerFast) -> None:
    client = redis.Redis.from_url(config.redis_url)
    processor = OutputProcessor(client, config, tokenizer, CancelRecorder())  # type: ignore[arg-type]
    processor.start()
    followed = followed_request(tokenizer)
    processor.follow(followed)
    processor.put(followed, EngineOutput(followed.request.request_id, tokenizer.encode(" a", add_special_tokens=False)))
    deadline = time.monotonic() + 5
    while not events(client, config, followed) and time.monotonic() < deadline:
        time.sleep(0.01)
    processor.forget(followed)
    processor.put(
        followed,
        EngineOutput(
            followed.request.request_id, tokenizer.encode(" dog", add_special_tokens=False), FinishReason.LENGTH
        ),
    )
    time.sleep(0.2)
    processor.stop()
    assert len(events(client, config, followed)) == 1 and not followed.done.is_set()


def test_events_redis_refuses_fail_their_requests(config: Config, tokenizer: PreTrainedTokenizerFast) -> None:
    nowhere = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    processor = OutputProcessor(nowhere, config, tokenizer, CancelRecorder())  # type: ignore[arg-type]
    processor.start()
    followed = followed_request(tokenizer)
    processor.follow(followed)
    processor.put(followed, EngineOutput(followed.request.request_id, tokenizer.encode(" a", add_special_tokens=False)))
    assert followed.done.wait(10)
    processor.stop()
    assert isinstance(followed.failure, redis.RedisError)
