"""Reads and writes of stored responses; a response is visible only to its tenant, and only if it was stored."""

from __future__ import annotations

from sqlalchemy import delete
from sqlalchemy.orm import Session

from tasks.store.models import RequestRecord
from tasks.store.response_models import ResponseRecord


def create_response(session: Session, record: ResponseRecord) -> None:
    session.add(record)
    session.commit()


def get_owned_response(session: Session, response_id: str, tenant: str) -> ResponseRecord | None:
    """The stored response if `tenant` owns it: another tenant's, or one made with store false, is as absent as one
    that never existed."""
    record = session.get(ResponseRecord, response_id)
    return record if record is not None and record.tenant == tenant and record.store else None


def delete_response(session: Session, record: ResponseRecord) -> None:
    """Remove the response, and its request (prompt and result) once that has ended; a running request keeps its
    row until the worker records how it ended."""
    request_id, is_finished = record.request_id, record.request.is_finished
    session.execute(delete(ResponseRecord).where(ResponseRecord.id == record.id))
    if is_finished:
        session.execute(delete(RequestRecord).where(RequestRecord.id == request_id))
    session.commit()
