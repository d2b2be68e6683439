"""The SQL ledger on SQLite and PostgreSQL, with the schema built by Alembic from empty."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import inspect
from sqlalchemy.orm import Session

from tasks.messages.generation import ErrorInfo, FinishReason
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tasks.store.models import RequestRecord, RequestStatus
from tasks.store.request_store import claim_request, claim_requests, create_request, get_request, record_result


@pytest.fixture(params=["sqlite", "postgresql"])
def session(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Session]:
    if request.param == "postgresql":
        database_url = request.getfixturevalue("postgres_url")
    else:
        database_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade_to_head(database_url)
    upgrade_to_head(database_url)  # idempotent
    engine = make_db_engine(database_url)
    assert {"requests", "results", "alembic_version"} <= set(inspect(engine).get_table_names())
    with make_session_factory(engine)() as db:
        yield db
        db.query(RequestRecord).delete()
        db.commit()
    engine.dispose()


def new_record(request_id: str) -> RequestRecord:
    return RequestRecord(
        id=request_id,
        endpoint="chat.completions",
        model="tiny",
        status=RequestStatus.QUEUED.value,
        body={"messages": [{"role": "user", "content": "hé"}]},
        prompt_tokens=3,
        created=int(time.time()),  # a live stack's reaper on this database fails older queued rows
    )


def test_request_lifecycle(session: Session) -> None:
    create_request(session, new_record("chatcmpl-a"))
    assert claim_request(session, "chatcmpl-a", "w1") == RequestStatus.QUEUED
    assert claim_request(session, "chatcmpl-a", "w1") == RequestStatus.RUNNING
    assert record_result(session, "chatcmpl-a", text="hello", completion_tokens=2, finish_reason=FinishReason.STOP)
    assert not record_result(
        session, "chatcmpl-a", text="again", completion_tokens=9, finish_reason=FinishReason.LENGTH
    )
    session.expire_all()
    record = get_request(session, "chatcmpl-a")
    assert record is not None and record.status == "completed" and record.is_finished
    assert record.result is not None and (record.result.text, record.result.completion_tokens) == ("hello", 2)
    assert record.body["messages"][0]["content"] == "hé" and record.worker == "w1"


def test_a_result_another_writer_stores_after_the_check_stands(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers may both find a request unfinished (a stream's relay and the restarted worker's reaper or redelivered
    task, each seeing the dead worker's lease lapse): the one that writes second gets False, not the database's error,
    and the first one's result stands."""
    create_request(session, new_record("chatcmpl-r"))
    assert claim_request(session, "chatcmpl-r", "w1") == RequestStatus.QUEUED
    other_writer = make_session_factory(session.get_bind())
    checked = session.get
    raced: list[str] = []  # the other writer records once, right after this call's first check

    def check_then_another_writer_records(entity: type, ident: str) -> object:
        found = checked(entity, ident)
        if not raced:
            raced.append(ident)
            with other_writer() as other:
                assert record_result(other, ident, text="first", completion_tokens=1, finish_reason=FinishReason.STOP)
        return found

    monkeypatch.setattr(session, "get", check_then_another_writer_records)
    lost = ErrorInfo("The worker stopped.", "server_error")
    assert not record_result(session, "chatcmpl-r", text="", completion_tokens=0, finish_reason=None, error=lost)
    monkeypatch.undo()
    session.expire_all()
    record = get_request(session, "chatcmpl-r")
    assert record is not None and record.status == "completed"
    assert record.result is not None and (record.result.text, record.result.error) == ("first", None)


def test_abort_and_error_map_to_statuses(session: Session) -> None:
    create_request(session, new_record("chatcmpl-b"))
    create_request(session, new_record("chatcmpl-c"))
    record_result(session, "chatcmpl-b", text="", completion_tokens=1, finish_reason=FinishReason.ABORT)
    record_result(session, "chatcmpl-c", text="", completion_tokens=0, finish_reason=None, error=ErrorInfo("x"))
    session.expire_all()
    assert get_request(session, "chatcmpl-b").status == "cancelled"  # type: ignore[union-attr]
    assert get_request(session, "chatcmpl-c").status == "failed"  # type: ignore[union-attr]
    assert claim_request(session, "chatcmpl-c", "w1") == RequestStatus.FAILED
    assert claim_request(session, "chatcmpl-missing", "w1") is None


def test_claims_together_answer_as_claims_one_after_another(session: Session) -> None:
    for request_id in ("q1", "q2", "taken", "done"):
        create_request(session, new_record(request_id))
    claim_request(session, "taken", "w0")
    record_result(session, "done", text="", completion_tokens=1, finish_reason=FinishReason.STOP)
    ids = ["q1", "taken", "missing", "q2", "done", "q1"]
    assert claim_requests(session, ids, "w1") == [
        RequestStatus.QUEUED,
        RequestStatus.RUNNING,
        None,
        RequestStatus.QUEUED,
        RequestStatus.COMPLETED,
        RequestStatus.RUNNING,  # its first claim in the same write took it
    ]
    session.expire_all()
    workers = {request_id: get_request(session, request_id).worker for request_id in ("q1", "q2", "taken")}  # type: ignore[union-attr]
    assert workers == {"q1": "w1", "q2": "w1", "taken": "w0"}
    assert get_request(session, "q2").status == RequestStatus.RUNNING.value  # type: ignore[union-attr]
    assert get_request(session, "q2").started_at is not None  # type: ignore[union-attr]


def test_migrations_upgrade_a_database_made_at_the_first_revision(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config as AlembicConfig

    from tasks.config import REPO_ROOT

    database_url = f"sqlite:///{tmp_path / 'old.db'}"
    alembic_config = AlembicConfig(str(REPO_ROOT / "alembic.ini"))
    alembic_config.set_main_option("sqlalchemy.url", database_url)
    command.upgrade(alembic_config, "0001")
    upgrade_to_head(database_url)
    columns = {column["name"] for column in inspect(make_db_engine(database_url)).get_columns("requests")}
    assert "worker" in columns
    command.downgrade(alembic_config, "base")
