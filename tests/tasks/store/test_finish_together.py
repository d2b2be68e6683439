"""Results of requests that end together: one transaction, one Redis round trip, and what `finish_request` promises
each, on SQLite and PostgreSQL with a real Redis."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy.exc import IntegrityError

from tasks.config import Config
from tasks.messages.generation import ErrorInfo, FinishReason, StreamEvent, UsageDetails
from tasks.store.db import SessionFactory, make_db_engine, make_session_factory, upgrade_to_head
from tasks.store.finish import final_event
from tasks.store.finish_together import RequestResult, finish_requests
from tasks.store.models import RequestRecord, RequestStatus
from tasks.store.request_store import create_request, get_request, record_result
from tasks.streams.redis_keys import RedisKeys


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionFactory]:
    if request.param == "postgresql":
        database_url = request.getfixturevalue("postgres_url")
    else:
        database_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade_to_head(database_url)
    engine = make_db_engine(database_url)
    factory = make_session_factory(engine)
    yield factory
    with factory() as session:
        session.query(RequestRecord).delete()
        session.commit()
    engine.dispose()


@pytest.fixture
def client_and_config(redis_url: str) -> Iterator[tuple[redis.Redis, Config]]:
    config = Config(redis_url=redis_url, is_redis_embedded=False, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client, config
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def queued(sessions: SessionFactory, prompt_tokens: int = 5) -> str:
    request_id = f"cmpl-{uuid.uuid4().hex}"
    with sessions() as session:
        create_request(
            session,
            RequestRecord(
                id=request_id,
                endpoint="completions",
                model="tiny",
                status=RequestStatus.QUEUED.value,
                body={},
                prompt_tokens=prompt_tokens,
                created=int(time.time()),  # a live stack's reaper on this database fails older queued rows
            ),
        )
    return request_id


def finals(client: redis.Redis, config: Config, request_id: str) -> list[dict]:
    key = RedisKeys(config.redis_prefix).request_stream(request_id)
    return [json.loads(fields["event"]) for _, fields in client.xrange(key)]


def test_results_recorded_together_stream_the_final_event_the_stored_row_makes(
    sessions: SessionFactory, client_and_config: tuple[redis.Redis, Config]
) -> None:
    client, config = client_and_config
    results = [
        RequestResult(
            queued(sessions, 7),
            7,
            text="hi",
            completion_tokens=2,
            finish_reason=FinishReason.STOP,
            usage_details=UsageDetails(cached_tokens=3),
            steering={"features": [{"index": 1}]},
            monitor={"positions": [[0, 1.5]]},
        ),
        RequestResult(queued(sessions), 5, error=ErrorInfo("bad", "invalid_request_error", "prompt")),
        RequestResult(queued(sessions), 5, finish_reason=FinishReason.ABORT),
    ]
    assert finish_requests(sessions, client, config, results) == [True, True, True]
    with sessions() as session:
        statuses = [get_request(session, result.request_id).status for result in results]  # type: ignore[union-attr]
        stored_finals = [final_event(session, result.request_id).to_dict() for result in results]
    assert statuses == ["completed", "failed", "cancelled"]
    assert [finals(client, config, result.request_id) for result in results] == [[event] for event in stored_finals]
    assert StreamEvent.from_dict(stored_finals[0]).usage.prompt_tokens == 7  # type: ignore[union-attr]


def test_a_result_another_writer_recorded_stands_and_streams_nothing(
    sessions: SessionFactory, client_and_config: tuple[redis.Redis, Config]
) -> None:
    client, config = client_and_config
    first, second = queued(sessions), queued(sessions)
    with sessions() as session:
        assert record_result(session, first, text="theirs", completion_tokens=1, finish_reason=FinishReason.STOP)
    outcomes = finish_requests(
        sessions, client, config, [RequestResult(first, 5, text="ours"), RequestResult(second, 5, text="ours")]
    )
    assert outcomes == [False, True]
    with sessions() as session:
        assert get_request(session, first).result.text == "theirs"  # type: ignore[union-attr]
    assert finals(client, config, first) == [] and len(finals(client, config, second)) == 1


def test_when_the_batch_fails_each_is_recorded_on_its_own(
    sessions: SessionFactory, client_and_config: tuple[redis.Redis, Config]
) -> None:
    """A result for a request with no row breaks the batch's transaction (its foreign key): it fails alone, with the
    error `finish_request` raises for it, and the others still end."""
    client, config = client_and_config
    known = queued(sessions)
    outcomes = finish_requests(
        sessions, client, config, [RequestResult("cmpl-unknown", 5), RequestResult(known, 5, text="kept")]
    )
    assert isinstance(outcomes[0], IntegrityError) and outcomes[1] is True
    with sessions() as session:
        assert get_request(session, known).result.text == "kept"  # type: ignore[union-attr]
    assert len(finals(client, config, known)) == 1
