"""The batch ledger on SQLite and PostgreSQL, schema from Alembic: dispatch, claims, leases, the reaper, expiry and
closing, with one terminal row per line whatever order the writers come in."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tasks.batches.events import publish_lines, read_stop_flags
from tasks.batches.finalize import finalize_if_done
from tasks.batches.line_outcomes import LineOutcome, finish_lines
from tasks.batches.messages import ChunkTask
from tasks.batches.models import BatchLine, BatchRecord, BatchStatus, FileRecord, LineStatus
from tasks.batches.output import output_line, render_jsonl
from tasks.batches.store import (
    add_lines,
    begin_cancel,
    claim_chunk,
    dispatch_chunks,
    new_sortable_id,
    renew_lease,
    request_counts,
    start_validated,
)
from tasks.config import Config
from tasks.messages.generation import Endpoint, GenerateRequest, SamplingParams
from tasks.reapers.batch_reaper import (
    VALIDATION_INTERRUPTED,
    VALIDATION_TIMEOUT_S,
    begin_expiry,
    reap_once,
    return_lapsed_lines,
)
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tasks.store.models import Base
from tasks.streams.redis_keys import RedisKeys
from tests.batch_rows import accept_rows, queued_line_row
from tests.postgres import own_database

CONFIG = Config(batch_chunk_size=3, batch_chunks_in_flight=2, batch_max_attempts=2, batch_dispatch_timeout_s=60)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with ExitStack() as cleanup:
        if request.param == "postgresql":
            database_url = cleanup.enter_context(own_database(request.getfixturevalue("postgres_url")))
        else:
            database_url = f"sqlite:///{tmp_path / 'ledger.db'}"
        upgrade_to_head(database_url)
        engine = make_db_engine(database_url)
        yield engine
        engine.dispose()


@pytest.fixture
def session(db_engine: Engine) -> Iterator[Session]:
    with make_session_factory(db_engine)() as db:
        yield db


def test_the_migrations_match_the_models(db_engine: Engine) -> None:
    with db_engine.connect() as connection:
        diffs = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diffs == []


def make_batch(session: Session, num_lines: int, expires_in_s: int = 3600, model: str = "tiny") -> str:
    now = int(time.time())
    batch = BatchRecord(
        id=new_sortable_id("batch_"),
        endpoint="/v1/completions",
        model=model,
        input_file_id="file-x",
        completion_window="24h",
        status=BatchStatus.VALIDATING.value,
        created_at=now,
        expires_at=now + expires_in_s,
    )
    session.add(batch)
    session.commit()
    rows = [_row(batch.id, line_no) for line_no in range(1, num_lines + 1)]
    assert accept_rows(session, batch.id, rows)
    return batch.id


def _row(batch_id: str, line_no: int) -> dict:
    request = GenerateRequest(
        f"cmpl-{batch_id}-{line_no}", Endpoint.COMPLETIONS, "tiny", [1, 2, 3], SamplingParams(max_tokens=4), 0
    )
    return queued_line_row(batch_id, line_no, request)


def done(text: str = "ok") -> LineOutcome:
    return LineOutcome(LineStatus.COMPLETED, text, "length", 4)


def statuses(session: Session, batch_id: str) -> list[str]:
    session.expire_all()
    query = select(BatchLine.status).where(BatchLine.batch_id == batch_id).order_by(BatchLine.line_no)
    return list(session.scalars(query))


def test_a_line_number_appears_once_per_batch(session: Session) -> None:
    batch_id = make_batch(session, 1)
    session.add(BatchLine(**_row(batch_id, 1)))
    with pytest.raises(IntegrityError):
        session.commit()


def test_dispatch_fills_the_window_with_chunks_oldest_batch_first(session: Session) -> None:
    first, second = make_batch(session, 4), make_batch(session, 2)
    chunks = dispatch_chunks(session, CONFIG)
    assert [chunk.batch_id for chunk in chunks] == [first, first]
    assert statuses(session, first) == ["dispatched"] * 4 and statuses(session, second) == ["queued"] * 2
    assert dispatch_chunks(session, CONFIG) == [], "the window is full"
    owner = "w#1"
    lines = claim_chunk(session, chunks[1], owner, lease_s=30)
    assert [line.line_no for line in lines] == [4]
    assert set(finish_lines(session, owner, {lines[0].id: done()})) == {lines[0].id}
    assert [chunk.batch_id for chunk in dispatch_chunks(session, CONFIG)] == [second]


def test_each_model_has_its_own_dispatch_window_and_bulk_queue(session: Session) -> None:
    first, other = make_batch(session, 9), make_batch(session, 2, model="twin")
    chunks = dispatch_chunks(session, CONFIG)  # tiny's window full, twin's batch is not held up behind it
    assert [(chunk.batch_id, chunk.model) for chunk in chunks] == [(first, "tiny"), (first, "tiny"), (other, "twin")]
    assert dispatch_chunks(session, CONFIG) == []
    assert CONFIG.bulk_queue_of(chunks[2].model) == "bulk.twin"


def test_lines_finished_together_are_recorded_except_those_taken_from_their_owner(session: Session) -> None:
    batch_id = make_batch(session, 3)
    [chunk] = dispatch_chunks(session, CONFIG)
    lines = claim_chunk(session, chunk, "w#1", lease_s=30)
    session.execute(update(BatchLine).where(BatchLine.id == lines[1].id).values(lease_owner="w#2"))
    session.commit()
    outcomes = {line.id: done(f"text {line.line_no}") for line in lines}
    assert set(finish_lines(session, "w#1", outcomes)) == {lines[0].id, lines[2].id}
    assert statuses(session, batch_id) == ["completed", "running", "completed"]
    assert [session.get(BatchLine, line.id).text for line in lines] == ["text 1", None, "text 3"]  # type: ignore[union-attr]


@pytest.mark.parametrize("is_one_line_taken", [False, True])
def test_what_is_published_before_each_commit_comes_before_any_closer_can_see_the_lines_finished(
    db_engine: Engine, session: Session, is_one_line_taken: bool
) -> None:
    """A batch's closer publishes its final status once it sees no open line; a line's event, published in
    `before_commit`, must already be out by then, or a reader that stops at the final status misses it."""
    batch_id = make_batch(session, 3)
    [chunk] = dispatch_chunks(session, CONFIG)
    lines = claim_chunk(session, chunk, "w#1", lease_s=30)
    if is_one_line_taken:  # the line-by-line path: a transaction a line
        session.execute(update(BatchLine).where(BatchLine.id == lines[1].id).values(lease_owner="w#2"))
        session.commit()
    published: list[tuple[set[int], bool]] = []

    def publish(recorded: dict[int, LineStatus]) -> None:
        with make_session_factory(db_engine)() as closer:
            published.append((set(recorded), finalize_if_done(closer, batch_id)))

    recorded = finish_lines(session, "w#1", {line.id: done() for line in lines}, publish)
    assert set().union(*(ids for ids, _ in published)) == set(recorded)
    assert not any(closed for _, closed in published), "a closer saw the lines finished before their events"
    with make_session_factory(db_engine)() as closer:
        assert finalize_if_done(closer, batch_id) is not is_one_line_taken  # the taken line is still running


def test_a_line_published_by_a_run_that_died_before_its_commit_is_not_published_again(
    session: Session, redis_url: str
) -> None:
    """A line's event goes out before its commit; a worker killed between the two leaves the line open, and the run
    that finishes it again publishes it again. The stream still has one event for it, and the other lines' events."""
    config = dataclasses.replace(CONFIG, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:")
    client = redis.Redis.from_url(redis_url)
    batch_id = make_batch(session, 3)
    [chunk] = dispatch_chunks(session, CONFIG)
    lines = claim_chunk(session, chunk, "w#1", lease_s=30)

    def publish_then_die(recorded: dict[int, LineStatus]) -> None:
        publish_lines(client, config, session, batch_id, [(line, recorded[line.id]) for line in lines[:2]])
        raise SystemExit("killed before the commit")

    with pytest.raises(SystemExit):
        finish_lines(session, "w#1", {line.id: done() for line in lines[:2]}, publish_then_die)
    session.rollback()
    assert statuses(session, batch_id) == ["running"] * 3  # nothing was recorded

    def publish(recorded: dict[int, LineStatus]) -> None:
        finished = [(line, recorded[line.id]) for line in lines if line.id in recorded]
        publish_lines(client, config, session, batch_id, finished)

    assert len(finish_lines(session, "w#1", {line.id: done("again") for line in lines}, publish)) == 3
    publish(dict.fromkeys([line.id for line in lines[1:]], LineStatus.COMPLETED))  # a third run of two of them
    entries = client.xrange(RedisKeys(config.redis_prefix).batch_stream(batch_id))
    line_numbers = [json.loads(fields[b"event"])["line_no"] for _, fields in entries]
    assert sorted(line_numbers) == [1, 2, 3]
    client.delete(*client.keys(f"{config.redis_prefix}*"))


def test_a_redelivered_chunk_claims_nothing_and_a_result_is_recorded_once(session: Session) -> None:
    make_batch(session, 3)
    [chunk] = dispatch_chunks(session, CONFIG)
    lines = claim_chunk(session, chunk, "w#1", lease_s=30)
    assert [line.attempts for line in lines] == [1, 1, 1]
    assert claim_chunk(session, chunk, "w#2", lease_s=30) == []
    assert set(finish_lines(session, "w#1", {lines[0].id: done("first")})) == {lines[0].id}
    assert set(finish_lines(session, "w#1", {lines[0].id: done("second")})) == set()
    assert set(finish_lines(session, "w#2", {lines[1].id: done()})) == set(), "only the lease holder records"
    assert renew_lease(session, chunk.chunk_id, "w#1", lease_s=30) == {lines[1].id, lines[2].id}
    session.expire_all()
    assert session.get(BatchLine, lines[0].id).text == "first"  # type: ignore[union-attr]


def test_lapsed_leases_return_to_the_queue_then_fail_after_max_attempts(session: Session) -> None:
    batch_id = make_batch(session, 2)
    for attempt in range(1, CONFIG.batch_max_attempts + 1):
        [chunk] = dispatch_chunks(session, CONFIG)
        lines = claim_chunk(session, chunk, f"dead#{attempt}", lease_s=0.0)
        assert [line.attempts for line in lines] == [attempt, attempt]
        assert return_lapsed_lines(session, CONFIG, time.time() + 1) == 2
    assert statuses(session, batch_id) == ["failed", "failed"]
    assert request_counts(session, batch_id).to_dict() == {"total": 2, "completed": 0, "failed": 2}
    assert finalize_if_done(session, batch_id)
    session.expire_all()
    batch = session.get(BatchRecord, batch_id)
    assert batch.status == "completed" and batch.output_file_id is None  # type: ignore[union-attr]
    error_file = session.get(FileRecord, batch.error_file_id)  # type: ignore[union-attr]
    assert b'"code": "worker_lost"' in error_file.content  # type: ignore[union-attr]


def test_a_dispatch_nobody_claimed_is_dispatched_again_and_the_old_message_claims_nothing(session: Session) -> None:
    batch_id = make_batch(session, 2)
    [lost] = dispatch_chunks(session, CONFIG)
    assert return_lapsed_lines(session, CONFIG, time.time() + CONFIG.batch_dispatch_timeout_s + 1) == 2
    assert statuses(session, batch_id) == ["queued", "queued"]
    [again] = dispatch_chunks(session, CONFIG)
    assert claim_chunk(session, lost, "w#1", lease_s=30) == []
    assert len(claim_chunk(session, again, "w#1", lease_s=30)) == 2


def test_expiry_ends_waiting_lines_now_and_running_ones_at_their_lease(session: Session) -> None:
    batch_id = make_batch(session, 4, expires_in_s=-1)
    chunk = dispatch_chunks(session, CONFIG)[0]
    running = claim_chunk(session, chunk, "w#1", lease_s=30)
    assert set(finish_lines(session, "w#1", {running[0].id: done()})) == {running[0].id}
    assert begin_expiry(session, time.time()) == [batch_id]
    assert statuses(session, batch_id) == ["completed", "running", "running", "expired"]
    assert not finalize_if_done(session, batch_id), "lines still run"
    return_lapsed_lines(session, CONFIG, time.time() + 60)
    assert statuses(session, batch_id) == ["completed", "expired", "expired", "expired"]
    assert finalize_if_done(session, batch_id) and not finalize_if_done(session, batch_id)
    session.expire_all()
    batch = session.get(BatchRecord, batch_id)
    assert batch.status == "expired" and batch.expired_at is not None  # type: ignore[union-attr]
    assert request_counts(session, batch_id).to_dict() == {"total": 4, "completed": 1, "failed": 3}
    output = session.get(FileRecord, batch.output_file_id).content  # type: ignore[union-attr]
    assert output.count(b"\n") == 1 and b'"custom_id": "c1"' in output


def test_closing_twice_writes_one_set_of_files(session: Session) -> None:
    batch_id = make_batch(session, 1)
    [chunk] = dispatch_chunks(session, CONFIG)
    [line] = claim_chunk(session, chunk, "w#1", lease_s=30)
    assert not finalize_if_done(session, batch_id), "a line is still running"
    finish_lines(session, "w#1", {line.id: done()})
    assert finalize_if_done(session, batch_id)
    assert not finalize_if_done(session, batch_id)
    files = list(session.scalars(select(FileRecord).where(FileRecord.filename.like(f"{batch_id}%"))))
    assert [file.filename for file in files] == [f"{batch_id}_output.jsonl"]
    assert files[0].content == render_jsonl([output_line(session.get(BatchLine, line.id))])  # type: ignore[arg-type]


def test_chunk_task_round_trips() -> None:
    chunk = ChunkTask("batch_1", "chunk_2", "tiny")
    assert ChunkTask.from_dict(chunk.to_dict()) == chunk


def test_a_reaper_pass_expires_a_due_batch_and_fails_an_interrupted_validation(
    db_engine: Engine, session: Session, redis_url: str
) -> None:
    config = dataclasses.replace(CONFIG, redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    due = make_batch(session, 3, expires_in_s=-1)
    stuck = BatchRecord(
        id=new_sortable_id("batch_"),
        endpoint="/v1/completions",
        model="tiny",
        input_file_id="f",
        completion_window="24h",
        status=BatchStatus.VALIDATING.value,
        created_at=int(time.time()) - VALIDATION_TIMEOUT_S - 1,
        expires_at=2**31 - 1,
    )
    session.add(stuck)
    session.commit()
    enqueued: list[ChunkTask] = []
    reap_once(make_session_factory(db_engine), client, config, enqueued.append)
    session.expire_all()
    assert session.get(BatchRecord, due).status == "expired"  # type: ignore[union-attr]
    assert statuses(session, due) == ["expired"] * 3 and enqueued == []
    assert read_stop_flags(client, config, [due, "batch_other"]) == {due: LineStatus.EXPIRED}
    assert session.get(BatchRecord, stuck.id).status == "failed"  # type: ignore[union-attr]
    events = client.xrange(RedisKeys(config.redis_prefix).batch_stream(due))
    assert json.loads(events[-1][1]["event"])["status"] == "expired"
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def validating_batch(session: Session, lease_expires_at: float) -> str:
    now = int(time.time())
    batch = BatchRecord(
        id=new_sortable_id("batch_"),
        endpoint="/v1/completions",
        model="tiny",
        input_file_id="file-x",
        completion_window="24h",
        status=BatchStatus.VALIDATING.value,
        created_at=now,
        expires_at=now + 3600,
        validation_lease_expires_at=lease_expires_at,
    )
    session.add(batch)
    session.commit()
    return batch.id


def test_a_validation_whose_lease_lapsed_fails_with_every_line_it_had_recorded(
    db_engine: Engine, session: Session, redis_url: str
) -> None:
    config = dataclasses.replace(CONFIG, redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    now = time.time()
    lapsed, live = validating_batch(session, now + 60), validating_batch(session, now + 60)
    invalid = {"code": "invalid_json", "message": "x", "param": None, "line": 2}
    invalid_row = {**_row(lapsed, 2), "request": None, "status": LineStatus.FAILED.value, "error": invalid}
    assert add_lines(session, lapsed, [_row(lapsed, 1), invalid_row], lease_expires_at=now - 1)  # its api died
    assert add_lines(session, live, [_row(live, 1)], lease_expires_at=now + 60)

    reap_once(make_session_factory(db_engine), client, config, lambda chunk: None)
    session.expire_all()
    failed = session.get(BatchRecord, lapsed)
    assert failed is not None and failed.status == "failed" and failed.failed_at is not None
    assert failed.errors == [VALIDATION_INTERRUPTED] and statuses(session, lapsed) == ["failed", "failed"]
    error_file = session.get(FileRecord, failed.error_file_id)
    assert error_file is not None
    errors = [json.loads(line) for line in error_file.content.splitlines()]
    assert [line["custom_id"] for line in errors] == ["c1", "c2"]
    assert errors[0]["response"]["body"]["error"]["code"] == "validation_interrupted" and errors[1]["error"] == invalid
    assert not add_lines(session, lapsed, [_row(lapsed, 3)], lease_expires_at=now + 60), "a late slice is refused"
    assert session.get(BatchRecord, live).status == "validating"  # type: ignore[union-attr]
    assert statuses(session, live) == ["queued"]
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def test_a_cancel_while_validating_stops_the_validation_at_its_next_slice(session: Session) -> None:
    batch_id = validating_batch(session, time.time() + 60)
    assert add_lines(session, batch_id, [_row(batch_id, 1)], lease_expires_at=time.time() + 60)
    assert begin_cancel(session, batch_id) and finalize_if_done(session, batch_id)
    assert not add_lines(session, batch_id, [_row(batch_id, 2)], lease_expires_at=time.time() + 60)
    assert not start_validated(session, batch_id, [])
    session.expire_all()
    assert session.get(BatchRecord, batch_id).status == "cancelled"  # type: ignore[union-attr]
    assert statuses(session, batch_id) == ["cancelled"]


def test_a_result_the_database_refuses_fails_that_line_alone(session: Session) -> None:
    batch_id = make_batch(session, 3)
    [chunk] = dispatch_chunks(session, CONFIG)
    lines = claim_chunk(session, chunk, "w#1", lease_s=30)
    outcomes = {line.id: done(f"text {line.line_no}") for line in lines}
    outcomes[lines[1].id] = done("byte \x00 zero")  # PostgreSQL's text cannot hold U+0000; SQLite's can
    recorded = finish_lines(session, "w#1", outcomes)
    is_refused = session.get_bind().dialect.name == "postgresql"
    assert recorded == {
        lines[0].id: LineStatus.COMPLETED,
        lines[1].id: LineStatus.FAILED if is_refused else LineStatus.COMPLETED,
        lines[2].id: LineStatus.COMPLETED,
    }
    assert statuses(session, batch_id) == ["completed", "failed" if is_refused else "completed", "completed"]
    assert [session.get(BatchLine, line.id).text for line in (lines[0], lines[2])] == ["text 1", "text 3"]  # type: ignore[union-attr]
    if is_refused:
        assert session.get(BatchLine, lines[1].id).error["code"] == "result_not_recorded"  # type: ignore[union-attr,index]
