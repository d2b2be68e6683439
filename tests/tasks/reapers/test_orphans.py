"""A running request whose worker's lease lapsed gets one error result and one final event."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import redis

from tasks.config import Config
from tasks.messages.generation import EventType, StreamEvent
from tasks.reapers.orphans import fail_if_orphaned, settle_quiet_request
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tasks.store.models import RequestRecord, RequestStatus
from tasks.store.request_store import claim_request, create_request, get_request
from tasks.streams.cancel_flags import is_cancel_requested
from tasks.streams.redis_keys import RedisKeys
from tasks.streams.worker_leases import renew_worker_lease


def test_only_requests_of_dead_workers_fail_and_only_once(redis_url: str, tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:", worker_lease_s=0.3)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    sessions = make_session_factory(make_db_engine(database_url))
    with sessions() as session:
        for request_id in ("queued", "running"):
            status = RequestStatus.QUEUED.value
            record = RequestRecord(id=request_id, endpoint="completions", model="tiny", body={}, status=status,
                                   prompt_tokens=2, created=0)  # fmt: skip
            create_request(session, record)
        claim_request(session, "running", "w1")
    renew_worker_lease(client, config, "w1")
    assert not fail_if_orphaned(sessions, client, config, "running"), "w1 is alive"
    assert not fail_if_orphaned(sessions, client, config, "queued"), "no worker has it"
    time.sleep(0.4)
    assert fail_if_orphaned(sessions, client, config, "running")
    assert not fail_if_orphaned(sessions, client, config, "running"), "already failed"
    with sessions() as session:
        record = get_request(session, "running")
        assert record is not None and record.status == "failed" and record.result.error["code"] == "worker_lost"  # type: ignore[union-attr]
    key = RedisKeys(config.redis_prefix).request_stream("running")
    events = [StreamEvent.from_dict(json.loads(fields["event"])) for _, fields in client.xrange(key)]
    assert [e.type for e in events] == [EventType.FINAL] and events[0].error is not None
    assert is_cancel_requested(client, config, "running")
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def test_a_quiet_streams_check_outlives_a_database_error(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The relay of a quiet stream checks its request in SQL; a database that fails the check must not end the
    stream (the relay calls this between frames: an exception would end its response mid-stream)."""
    config = Config(redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    unreachable = make_session_factory(make_db_engine(f"sqlite:///{tmp_path / 'no-such-folder' / 'db.sqlite'}"))
    settle_quiet_request(unreachable, client, config, "running")
    assert "could not check the quiet request running" in caplog.text
