"""The request reaper on a real Redis and SQLite: dead workers' requests fail without anyone watching them, on a
Redis without persistence a request queued before the server started fails as lost while a newer one waits, and a
request whose stream nobody resumed within the grace is cancelled."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tasks.config import Config
from tasks.messages.generation import FinishReason
from tasks.reapers.request_reaper import MIN_INTERVAL_S, RedisServerState, RequestReaper, reaper_interval_s
from tasks.store.db import SessionFactory, make_db_engine, make_session_factory, upgrade_to_head
from tasks.store.finish import finish_request
from tasks.store.models import RequestRecord, RequestStatus
from tasks.store.request_store import claim_request, create_request, get_request
from tasks.streams.attachments import attach
from tasks.streams.cancel_flags import is_cancel_requested
from tasks.streams.worker_leases import renew_worker_lease


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


def test_requests_whose_stream_nobody_resumed_are_cancelled_and_finished_ones_left_alone(
    reaper_parts: tuple[SessionFactory, redis.Redis, Config],
) -> None:
    sessions, client, config = reaper_parts
    config = dataclasses.replace(config, worker_lease_s=30, sse_heartbeat_s=0.1, stream_resume_grace_s=0.3)
    renew_worker_lease(client, config, "live")
    now = int(time.time())
    for request_id, worker in (("running", "live"), ("queued", None), ("done", "live"), ("read", "live")):
        add_request(sessions, request_id, now, worker=worker)
    with sessions() as session:
        finish_request(session, client, config, "done", text="hi", completion_tokens=1, finish_reason=FinishReason.STOP)
    for request_id in ("running", "queued", "done"):
        attach(client, config, request_id).detach()
    reader = attach(client, config, "read")
    reaper = RequestReaper(sessions, client, config)
    reaper.reap_once()
    assert not any(is_cancel_requested(client, config, request_id) for request_id in ("running", "queued", "done"))
    time.sleep(0.35)
    reader.renew_if_due()
    reaper.reap_once()
    assert is_cancel_requested(client, config, "running")  # its worker's cancel watcher aborts it
    assert status_and_code(sessions, "queued") == ("cancelled", None)
    assert status_and_code(sessions, "done") == ("completed", None) and not is_cancel_requested(client, config, "done")
    assert status_and_code(sessions, "read") == ("running", None) and not is_cancel_requested(client, config, "read")


def test_the_reaper_runs_often_enough_for_the_resume_grace() -> None:
    assert reaper_interval_s(Config(worker_lease_s=15, stream_resume_grace_s=30)) == 7.5
    assert reaper_interval_s(Config(worker_lease_s=15, stream_resume_grace_s=2)) == 1.0
    assert reaper_interval_s(Config(worker_lease_s=15, stream_resume_grace_s=0)) == MIN_INTERVAL_S
