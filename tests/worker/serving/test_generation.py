"""The worker's task handler on the real engine, Redis and SQLite: one result per request, whatever is redelivered."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from transformers import PreTrainedTokenizerFast

from tasks.config import Config
from tasks.messages.generation import Endpoint, EventType, FinishReason, GenerateRequest, SamplingParams, StreamEvent
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tasks.store.models import RequestRecord, RequestStatus
from tasks.store.request_store import claim_request, create_request, get_request
from tasks.streams.cancel_flags import request_cancel
from tasks.streams.events import append_event
from tasks.streams.redis_keys import RedisKeys
from tasks.streams.worker_leases import renew_worker_lease
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.model_runner import ModelRunner
from worker.serving.generation import GenerationHandler
from worker.serving.metrics import ServingMetrics


@contextmanager
def running_handler(tiny_model_dir: Path, redis_url: str, database_url: str) -> Iterator[GenerationHandler]:
    """A task handler on its own engine, over `database_url` (migrated here) and keys no other test shares."""
    upgrade_to_head(database_url)
    config = Config(model=str(tiny_model_dir), redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:",
                    database_url=database_url, is_redis_embedded=False, device="cpu", max_num_seqs=4,
                    kv_cache_tokens=4096)  # fmt: skip
    engine = ContinuousEngine(ModelRunner(config), config)
    engine.start()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    db_engine = make_db_engine(database_url)
    handler = GenerationHandler(
        config=config,
        engine=engine,
        tokenizer=PreTrainedTokenizerFast.from_pretrained(tiny_model_dir),
        client=client,
        sessions=make_session_factory(db_engine),
        worker="test-worker",
        metrics=ServingMetrics(),
    )
    try:
        yield handler
    finally:
        handler.close()
        engine.stop()
        db_engine.dispose()
        for key in client.scan_iter(f"{config.redis_prefix}*"):
            client.delete(key)


@pytest.fixture(scope="module")
def handler(
    tiny_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GenerationHandler]:
    database_url = f"sqlite:///{tmp_path_factory.mktemp('handler') / 'db.sqlite'}"
    with running_handler(tiny_model_dir, redis_url, database_url) as running:
        yield running


def accept(handler: GenerationHandler, text: str, **sampling: object) -> GenerateRequest:
    """What the api does before enqueueing: a queued row in SQL."""
    request = GenerateRequest(
        request_id=f"cmpl-{uuid.uuid4().hex}",
        endpoint=Endpoint.COMPLETIONS,
        model="tiny",
        prompt_token_ids=handler.tokenizer.encode(text),
        sampling=SamplingParams(**{"max_tokens": 16, "temperature": 0.0, **sampling}),  # type: ignore[arg-type]
        created=int(time.time()),
    )
    record = RequestRecord(id=request.request_id, endpoint=request.endpoint.value, model="tiny",
                           status=RequestStatus.QUEUED.value, body={}, prompt_tokens=len(request.prompt_token_ids),
                           created=request.created)  # fmt: skip
    with handler.sessions() as session:
        create_request(session, record)
    return request


def stream_events(handler: GenerationHandler, request_id: str) -> list[StreamEvent]:
    key = RedisKeys(handler.config.redis_prefix).request_stream(request_id)
    return [StreamEvent.from_dict(json.loads(fields["event"])) for _, fields in handler.redis.xrange(key)]


def stored(handler: GenerationHandler, request_id: str) -> RequestRecord:
    with handler.sessions() as session:
        record = get_request(session, request_id)
    assert record is not None
    return record


def test_events_and_the_stored_result_agree(handler: GenerationHandler) -> None:
    request = accept(handler, "the cat", ignore_eos=True)
    handler.handle(request)
    events = stream_events(handler, request.request_id)
    assert events[0].type == EventType.START and events[-1].type == EventType.FINAL
    assert all(e.type == EventType.DELTA for e in events[1:-1])
    record = stored(handler, request.request_id)
    assert record.status == "completed" and record.result is not None
    assert record.result.text == "".join(e.text for e in events)
    assert record.result.completion_tokens == 16 == sum(len(e.token_ids) for e in events)
    assert events[-1].finish_reason == FinishReason.LENGTH and events[-1].usage.completion_tokens == 16  # type: ignore[union-attr]


def test_a_redelivered_finished_task_changes_nothing(handler: GenerationHandler) -> None:
    request = accept(handler, "the dog")
    handler.handle(request)
    before = (stream_events(handler, request.request_id), stored(handler, request.request_id).result.text)  # type: ignore[union-attr]
    handler.handle(request)
    assert (stream_events(handler, request.request_id), stored(handler, request.request_id).result.text) == before  # type: ignore[union-attr]


def test_redelivery_after_a_worker_died_mid_stream_ends_in_one_error(handler: GenerationHandler) -> None:
    request = accept(handler, "the bird")
    with handler.sessions() as session:
        claim_request(session, request.request_id, "dead-worker")  # the dead worker had claimed it ...
    append_event(handler.redis, handler.config, request.request_id, StreamEvent(EventType.START))  # ... streamed
    handler.handle(request)
    events = stream_events(handler, request.request_id)
    assert [e.type for e in events] == [EventType.START, EventType.FINAL]
    assert events[-1].error is not None and events[-1].error.code == "worker_lost"
    assert stored(handler, request.request_id).status == "failed"
    handler.handle(request)  # redelivered again: the failed request stays as it ended
    assert stream_events(handler, request.request_id) == events


def test_redelivery_of_a_request_a_live_worker_runs_leaves_it_running(handler: GenerationHandler) -> None:
    request = accept(handler, "the owl", ignore_eos=True, max_tokens=3000)  # long: it would still run if not cancelled
    with handler.sessions() as session:
        claim_request(session, request.request_id, "live-worker")
    renew_worker_lease(handler.redis, handler.config, "live-worker")
    handler.handle(request)
    assert stream_events(handler, request.request_id) == []
    assert stored(handler, request.request_id).status == "running"
    # the engine had started on it before the claim said it was another worker's: it was cancelled there
    deadline = time.monotonic() + 2
    while handler.engine.load().num_running + sum(handler.engine.load().num_waiting_by_priority.values()) > 0:
        assert time.monotonic() < deadline, "the request this run does not own still runs in the engine"
        time.sleep(0.01)


def test_cancel_before_start_aborts_without_running(handler: GenerationHandler) -> None:
    request = accept(handler, "the fish")
    request_cancel(handler.redis, handler.config, request.request_id)
    handler.handle(request)
    events = stream_events(handler, request.request_id)
    assert [e.type for e in events] == [EventType.FINAL] and events[0].finish_reason == FinishReason.ABORT
    assert stored(handler, request.request_id).status == "cancelled"


def test_cancel_while_streaming_reaches_the_engine_through_the_watcher(handler: GenerationHandler) -> None:
    request = accept(handler, "the horse", ignore_eos=True, max_tokens=2000)
    stream = RedisKeys(handler.config.redis_prefix).request_stream(request.request_id)

    def cancel_after_the_first_delta() -> None:
        deadline = time.monotonic() + 30
        while handler.redis.xlen(stream) < 2 and time.monotonic() < deadline:  # START, then a DELTA
            time.sleep(0.01)
        request_cancel(handler.redis, handler.config, request.request_id)

    canceller = threading.Thread(target=cancel_after_the_first_delta)
    canceller.start()
    started = time.monotonic()
    handler.handle(request)
    canceller.join()

    events = stream_events(handler, request.request_id)
    assert events[-1].type == EventType.FINAL and events[-1].finish_reason == FinishReason.ABORT
    assert 0 < sum(len(e.token_ids) for e in events) < 2000
    assert time.monotonic() - started < 30
    assert stored(handler, request.request_id).status == "cancelled"
    assert not handler.cancels._callbacks  # forgotten once finished


def test_stop_string_ends_the_request_and_stays_out_of_the_text(handler: GenerationHandler) -> None:
    free = accept(handler, "the cat", ignore_eos=True)
    handler.handle(free)
    full = stored(handler, free.request_id).result.text  # type: ignore[union-attr]
    stop = full[3:6]
    cut = accept(handler, "the cat", ignore_eos=True, stop=(stop,))
    handler.handle(cut)
    record = stored(handler, cut.request_id)
    assert record.result.finish_reason == "stop"  # type: ignore[union-attr]
    assert record.result.text == full[: full.index(stop)]  # type: ignore[union-attr]
    assert "".join(e.text for e in stream_events(handler, cut.request_id)) == record.result.text  # type: ignore[union-attr]


def test_a_choice_a_stop_string_ends_is_cancelled_in_the_engine(
    handler: GenerationHandler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop string ends a choice while the engine still generates it: the engine must be told to stop, or the row
    would run on to max_tokens. The stop string is cut from the model's own text, so any weights reach it."""
    whole = accept(handler, "the cat", ignore_eos=True)
    handler.handle(whole)
    text = stored(handler, whole.request_id).result.text  # type: ignore[union-attr]
    cancelled: list[str] = []
    cancel = handler.engine.cancel
    monkeypatch.setattr(handler.engine, "cancel", lambda request_id: (cancelled.append(request_id), cancel(request_id)))
    cut = accept(handler, "the cat", ignore_eos=True, max_tokens=256, stop=(text[3:6],))
    handler.handle(cut)
    assert stored(handler, cut.request_id).result.finish_reason == "stop"  # type: ignore[union-attr]
    assert cut.request_id in cancelled
