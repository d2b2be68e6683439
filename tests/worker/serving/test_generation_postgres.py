"""The worker's task handler on the real engine, Redis and PostgreSQL, whose text columns refuse what SQLite takes:
a result that holds byte 0 is recorded (its text shows U+FFFD), and a result the database still refuses ends its
request with an error instead of leaving it running."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tasks.config import Config
from tasks.db import make_db_engine, make_session_factory, upgrade_to_head
from tasks.messages import ChoiceResult, EventType, FinishReason
from tests.worker.serving.test_generation import accept, stored, stream_events
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.model_runner import ModelRunner
from worker.serving.generation import GenerationHandler, Outcome
from worker.serving.metrics import ServingMetrics


@pytest.fixture(scope="module")
def handler(tiny_model_dir: Path, redis_url: str, postgres_url: str) -> Iterator[GenerationHandler]:
    upgrade_to_head(postgres_url)
    config = Config(model=str(tiny_model_dir), redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:",
                    database_url=postgres_url, is_redis_embedded=False, device="cpu", max_num_seqs=4,
                    kv_cache_tokens=4096)  # fmt: skip
    engine = ContinuousEngine(ModelRunner(config), config)
    engine.start()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    db_engine = make_db_engine(postgres_url)
    handler = GenerationHandler(
        config=config,
        engine=engine,
        tokenizer=PreTrainedTokenizerFast.from_pretrained(tiny_model_dir),
        client=client,
        sessions=make_session_factory(db_engine),
        worker="test-worker",
        metrics=ServingMetrics(),
    )
    yield handler
    handler.close()
    engine.stop()
    db_engine.dispose()
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def test_generated_byte_zero_is_recorded_as_the_replacement_character(handler: GenerationHandler) -> None:
    nul_id = handler.tokenizer.convert_tokens_to_ids(bytes_to_unicode()[0])
    request = accept(handler, "the cat", ignore_eos=True, max_tokens=4, logit_bias=((nul_id, 100.0),))
    handler.handle(request)
    record = stored(handler, request.request_id)
    assert record.status == "completed" and record.result is not None
    assert record.result.text == "\ufffd" * 4
    assert "".join(event.text for event in stream_events(handler, request.request_id)) == record.result.text


def test_a_result_the_database_refuses_ends_the_request_with_an_error(handler: GenerationHandler) -> None:
    request = accept(handler, "the dog")
    refused = Outcome([ChoiceResult(0, "nul \x00 byte", FinishReason.LENGTH)], 3)  # what no choice writes now
    handler._finish(request, refused)
    record = stored(handler, request.request_id)
    assert record.status == "failed" and record.result is not None and record.result.error is not None
    assert record.result.error["code"] == "result_not_recorded"
    events = stream_events(handler, request.request_id)
    assert [event.type for event in events] == [EventType.FINAL] and events[0].error is not None
