"""The request reaper on a real Redis and SQLite: dead workers' requests fail without anyone watching them, and on a
Redis without persistence a request queued before the server started fails as lost while a newer one waits."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tasks.config import Config
from tasks.db import SessionFactory, make_db_engine, make_session_factory, upgrade_to_head
from tasks.models import RequestRecord, RequestStatus
from tasks.request_reaper import RedisServerState, RequestReaper
from tasks.store import claim_request, create_request, get_request
from tasks.streams import renew_worker_lease


@pytest.fixture
def reaper_parts(redis_url: str, tmp_path: Path) -> Iterator[tuple[SessionFactory, redis.Redis, Config]]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:", worker_lease_s=0.3)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield make_session_factory(make_db_engine(database_url)), client, config
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def add_request(sessions: SessionFactory, request_id: str, created: int, worker: str | None = None) -> None:
    with sessions() as session:
        record = RequestRecord(id=request_id, endpoint="completions", model="tiny", body={},
                               status=RequestStatus.QUEUED.value, prompt_tokens=2, created=created)  # fmt: skip
        create_request(session, record)
        if worker is not None:
            claim_request(session, request_id, worker)


def status_and_code(sessions: SessionFactory, request_id: str) -> tuple[str, str | None]:
    with sessions() as session:
        record = get_request(session, request_id)
        assert record is not None
        return record.status, record.result.error["code"] if record.result and record.result.error else None


def test_dead_workers_requests_fail_unwatched_and_live_ones_run_on(
    reaper_parts: tuple[SessionFactory, redis.Redis, Config],
) -> None:
    sessions, client, config = reaper_parts
    now = int(time.time())
    add_request(sessions, "on-dead", now, worker="dead")
    add_request(sessions, "on-live", now, worker="live")
    renew_worker_lease(client, config, "dead")
    time.sleep(0.4)  # the dead worker's lease lapses
    renew_worker_lease(client, config, "live")
    RequestReaper(sessions, client, config).reap_once()
    assert status_and_code(sessions, "on-dead") == ("failed", "worker_lost")
    assert status_and_code(sessions, "on-live") == ("running", None)


def test_queued_before_a_non_persistent_server_started_is_lost_and_newer_waits(
    reaper_parts: tuple[SessionFactory, redis.Redis, Config],
) -> None:
    sessions, client, config = reaper_parts
    server = RedisServerState.read(client)
    if server.is_persistent:
        pytest.skip("the tests' Redis keeps an append-only file: its queues survive a restart")
    add_request(sessions, "before", int(server.started_at) - 5)
    add_request(sessions, "after", int(time.time()))
    RequestReaper(sessions, client, config).reap_once()
    assert status_and_code(sessions, "before") == ("failed", "queue_lost")
    assert status_and_code(sessions, "after") == ("queued", None)
