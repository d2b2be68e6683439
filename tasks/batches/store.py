"""The batch ledger's writes: every line moves queued -> dispatched -> running -> one terminal status, each step a
conditional UPDATE, so racing writers (workers, reapers, the api) never give a line two results."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import distinct, func, insert, select, update
from sqlalchemy.orm import Session

from tasks.batches.messages import ChunkTask, RequestCounts
from tasks.batches.models import BatchLine, BatchRecord, BatchStatus, LineStatus
from tasks.config import Config

STOPPABLE_BATCH_VALUES = (BatchStatus.VALIDATING.value, BatchStatus.IN_PROGRESS.value)
WAITING_LINE_VALUES = (LineStatus.QUEUED.value, LineStatus.DISPATCHED.value)
MAX_BATCH_ERRORS = 100  # validation errors kept on the batch object; the error file has them all


_LINES = BatchLine.__table__


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def new_sortable_id(prefix: str) -> str:
    """An id that sorts by creation time (to the nanosecond), for newest-first listing with an `after` cursor."""
    return f"{prefix}{time.time_ns():016x}{uuid.uuid4().hex[:16]}"


def request_counts(session: Session, batch_id: str) -> RequestCounts:
    rows = session.execute(
        select(BatchLine.status, func.count()).where(BatchLine.batch_id == batch_id).group_by(BatchLine.status)
    ).all()
    by_status = {status: int(count) for status, count in rows}
    completed = by_status.get(LineStatus.COMPLETED.value, 0)
    failed = sum(by_status.get(s.value, 0) for s in (LineStatus.FAILED, LineStatus.CANCELLED, LineStatus.EXPIRED))
    return RequestCounts(total=sum(by_status.values()), completed=completed, failed=failed)


def count_open_lines(session: Session, batch_id: str) -> int:
    open_values = (*WAITING_LINE_VALUES, LineStatus.RUNNING.value)
    query = select(func.count()).where(BatchLine.batch_id == batch_id, BatchLine.status.in_(open_values))
    return int(session.scalar(query) or 0)


def dispatch_chunks(session: Session, config: Config, now: float | None = None) -> list[ChunkTask]:
    """Mark queued lines dispatched, a chunk at a time, oldest batch first, until each model has
    `batch_chunks_in_flight` chunks dispatched or running, in one transaction; the caller enqueues the returned chunks
    (a lost one is redispatched at its deadline). Per model: a model without workers never holds up another's."""
    now = time.time() if now is None else now
    in_flight_values = (LineStatus.DISPATCHED.value, LineStatus.RUNNING.value)
    in_flight = session.execute(
        select(BatchRecord.model, func.count(distinct(BatchLine.chunk_id)))
        .join(BatchRecord, BatchRecord.id == BatchLine.batch_id)
        .where(BatchLine.status.in_(in_flight_values))
        .group_by(BatchRecord.model)
    ).all()
    num_in_flight = {model: int(count) for model, count in in_flight}
    chunks: list[ChunkTask] = []
    while True:
        full = {model for model, count in num_in_flight.items() if count >= config.batch_chunks_in_flight}
        chunk = _dispatch_one(session, config, now, full)
        if chunk is None:
            break
        chunks.append(chunk)
        num_in_flight[chunk.model] = num_in_flight.get(chunk.model, 0) + 1
    session.commit()
    session.expire_all()  # the UPDATEs bypassed the ORM, so lines this session had loaded must load again
    return chunks


def _dispatch_one(session: Session, config: Config, now: float, full_models: set[str]) -> ChunkTask | None:
    queued = (
        select(BatchLine.batch_id, BatchRecord.model)
        .join(BatchRecord, BatchRecord.id == BatchLine.batch_id)
        .where(
            BatchRecord.status == BatchStatus.IN_PROGRESS.value,
            BatchLine.status == LineStatus.QUEUED.value,
            BatchRecord.model.not_in(full_models),
        )
        .order_by(BatchRecord.created_at, BatchLine.batch_id)
        .limit(1)
    )
    oldest = session.execute(queued).first()
    if oldest is None:
        return None
    batch_id, model = oldest
    first_queued = (
        select(_LINES.c.id)
        .where(_LINES.c.batch_id == batch_id, _LINES.c.status == LineStatus.QUEUED.value)
        .order_by(_LINES.c.line_no)
        .limit(config.batch_chunk_size)
    )
    chunk = ChunkTask(batch_id=batch_id, chunk_id=new_id("chunk_"), model=model)
    session.execute(
        update(_LINES)
        .where(_LINES.c.id.in_(first_queued), _LINES.c.status == LineStatus.QUEUED.value)
        .values(
            status=LineStatus.DISPATCHED.value,
            chunk_id=chunk.chunk_id,
            lease_expires_at=now + config.batch_dispatch_timeout_s,
        )
    )
    return chunk


def claim_chunk(session: Session, chunk: ChunkTask, owner: str, lease_s: float) -> list[BatchLine]:
    """The chunk's lines still waiting for it, now running under `owner`'s lease; none if the chunk was redelivered
    after its lines finished, were cancelled, or were dispatched again in another chunk."""
    session.execute(
        update(BatchLine)
        .where(BatchLine.chunk_id == chunk.chunk_id, BatchLine.status == LineStatus.DISPATCHED.value)
        .values(
            status=LineStatus.RUNNING.value,
            lease_owner=owner,
            lease_expires_at=time.time() + lease_s,
            attempts=BatchLine.attempts + 1,
        )
    )
    session.commit()
    return list(session.scalars(select(BatchLine).where(*_held_by(chunk.chunk_id, owner)).order_by(BatchLine.line_no)))


def renew_lease(session: Session, chunk_id: str, owner: str, lease_s: float) -> set[int]:
    """Extend the lease of the chunk's lines `owner` still holds; returns their ids (a reaper may have taken some)."""
    session.execute(update(BatchLine).where(*_held_by(chunk_id, owner)).values(lease_expires_at=time.time() + lease_s))
    session.commit()
    return set(session.scalars(select(BatchLine.id).where(*_held_by(chunk_id, owner))))


def _held_by(chunk_id: str, owner: str) -> tuple:
    return BatchLine.chunk_id == chunk_id, BatchLine.status == LineStatus.RUNNING.value, BatchLine.lease_owner == owner


def stop_waiting_lines(session: Session, batch_id: str, status: LineStatus) -> int:
    """End the lines no worker runs yet with `status` (cancelled or expired); running ones end at their next step."""
    stopped = session.execute(
        update(BatchLine)
        .where(BatchLine.batch_id == batch_id, BatchLine.status.in_(WAITING_LINE_VALUES))
        .values(status=status.value, finished_at=time.time())
    )
    session.commit()
    return stopped.rowcount


def begin_cancel(session: Session, batch_id: str) -> bool:
    """validating or in_progress -> cancelling, and its waiting lines cancelled; False if it was past that."""
    now = int(time.time())
    moved = session.execute(
        update(BatchRecord)
        .where(BatchRecord.id == batch_id, BatchRecord.status.in_(STOPPABLE_BATCH_VALUES))
        .values(status=BatchStatus.CANCELLING.value, cancelling_at=now)
    )
    session.commit()
    if moved.rowcount != 1:
        return False
    stop_waiting_lines(session, batch_id, LineStatus.CANCELLED)
    return True


def stop_status(batch: BatchRecord) -> LineStatus | None:
    """The status running lines of this batch end with when stopped, or None while it should run on."""
    if batch.status == BatchStatus.CANCELLING.value:
        return LineStatus.CANCELLED
    if batch.expired_at is not None or batch.status == BatchStatus.EXPIRED.value:
        return LineStatus.EXPIRED
    if batch.status == BatchStatus.CANCELLED.value:
        return LineStatus.CANCELLED
    return None


def add_lines(session: Session, batch_id: str, rows: list[dict[str, Any]], lease_expires_at: float) -> bool:
    """Insert validated lines of a batch still validating and extend its validation lease, in one transaction; False,
    inserting nothing, once it is not validating (cancelled, or failed by the reaper)."""
    held = session.execute(
        update(BatchRecord)
        .where(BatchRecord.id == batch_id, BatchRecord.status == BatchStatus.VALIDATING.value)
        .values(validation_lease_expires_at=lease_expires_at)
    )  # the batch row first: on PostgreSQL its lock orders these lines against a cancel or the reaper
    if held.rowcount != 1:
        session.rollback()
        return False
    if rows:
        session.execute(insert(BatchLine), rows)
    session.commit()
    return True


def renew_validation_leases(session: Session, batch_ids: list[str], lease_expires_at: float) -> None:
    """Batches waiting for their validation to begin keep their lease, as those under way do with each slice."""
    session.execute(
        update(BatchRecord)
        .where(BatchRecord.id.in_(batch_ids), BatchRecord.status == BatchStatus.VALIDATING.value)
        .values(validation_lease_expires_at=lease_expires_at)
    )
    session.commit()


def start_validated(session: Session, batch_id: str, errors: list[dict[str, Any]], model: str | None = None) -> bool:
    """Once every line is in the ledger: validating -> in_progress when some line is valid, keeping the first
    validation errors on the batch and the `model` its lines name; False when none is valid (errors recorded, still
    validating, for the caller to fail it) or the batch was cancelled meanwhile."""
    has_valid_line = (
        session.scalar(
            select(BatchLine.id)
            .where(BatchLine.batch_id == batch_id, BatchLine.status == LineStatus.QUEUED.value)
            .limit(1)
        )
        is not None
    )
    values: dict[str, Any] = {"errors": errors[:MAX_BATCH_ERRORS] or None}
    if has_valid_line:
        values.update(status=BatchStatus.IN_PROGRESS.value, in_progress_at=int(time.time()))
    if model is not None:
        values["model"] = model
    moved = session.execute(
        update(BatchRecord)
        .where(BatchRecord.id == batch_id, BatchRecord.status == BatchStatus.VALIDATING.value)
        .values(**values)
    )
    session.commit()
    return has_valid_line and moved.rowcount == 1
