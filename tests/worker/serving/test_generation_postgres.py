"""The worker's task handler on the real engine, Redis and PostgreSQL, whose text columns refuse what SQLite takes:
a result that holds byte 0 is recorded (its text shows U+FFFD), and a result the database still refuses ends its
request with an error instead of leaving it running."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tasks.messages.generation import ChoiceResult, EventType, FinishReason
from tests.worker.serving.test_generation import accept, running_handler, stored, stream_events
from worker.serving.generation import GenerationHandler, Outcome


@pytest.fixture(scope="module")
def handler(tiny_model_dir: Path, redis_url: str, postgres_url: str) -> Iterator[GenerationHandler]:
    with running_handler(tiny_model_dir, redis_url, postgres_url) as running:
        yield running


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
