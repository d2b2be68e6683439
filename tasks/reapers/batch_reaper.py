"""One pass of the batch reaper: lapsed leases back to the queue (or failed after `batch_max_attempts`), lost
dispatches redispatched, due batches expired, finished batches closed, the dispatch window refilled, and expired
files deleted.

Every step is a conditional UPDATE, so any number of reapers (one per worker) may run at once."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis
from sqlalchemy import and_, func, select, update
from sqlalchemy.orm import Session

from tasks.batches.events import publish_status, set_stop_flag
from tasks.batches.file_expiry import delete_expired_files
from tasks.batches.finalize import fail_validation, finalize_if_done
from tasks.batches.messages import ChunkTask
from tasks.batches.models import OPEN_LINE_VALUES, BatchLine, BatchRecord, BatchStatus, LineStatus
from tasks.batches.output import WORKER_LOST
from tasks.batches.store import dispatch_chunks, stop_waiting_lines
from tasks.config import Config
from tasks.store.db import SessionFactory

logger = logging.getLogger(__name__)
VALIDATION_TIMEOUT_S = 600  # a batch validating this long with no lease (made before leases) had its api die
VALIDATION_INTERRUPTED = {
    "code": "validation_interrupted",
    "message": "The server stopped while validating the input file; submit the batch again.",
    "param": None,
    "line": None,
}
EXPIRING = and_(BatchRecord.status == BatchStatus.IN_PROGRESS.value, BatchRecord.expired_at.is_not(None))
CANCELLING = BatchRecord.status == BatchStatus.CANCELLING.value

Enqueue = Callable[[ChunkTask], None]


def reap_once(sessions: SessionFactory, client: redis.Redis, config: Config, enqueue: Enqueue) -> None:
    with sessions() as session:
        now = time.time()
        num_returned = return_lapsed_lines(session, config, now)
        if num_returned:
            logger.warning("returned %d batch lines whose worker stopped renewing its lease", num_returned)
        for batch_id in begin_expiry(session, now):
            set_stop_flag(client, config, batch_id, LineStatus.EXPIRED)
        stop_lines_of_stopping_batches(session)
        for batch_id in fail_interrupted_validations(session, now):
            logger.warning("batch %s: its validation stopped (the api validating it died); failed it", batch_id)
            publish_status(client, config, session, batch_id)
        for batch_id in batches_without_open_lines(session):
            if finalize_if_done(session, batch_id):
                publish_status(client, config, session, batch_id)
        dispatch_and_enqueue(session, config, enqueue)
        delete_expired_files(session, int(now))


def dispatch_and_enqueue(session: Session, config: Config, enqueue: Enqueue) -> None:
    for chunk in dispatch_chunks(session, config):
        try:
            enqueue(chunk)
        except Exception:  # its lines stay dispatched until their deadline, then go back to the queue
            logger.exception("could not enqueue chunk %s of %s", chunk.chunk_id, chunk.batch_id)


def return_lapsed_lines(session: Session, config: Config, now: float) -> int:
    """Running lines whose lease lapsed, and dispatched lines no worker claimed in time; returns how many moved."""
    lapsed = (BatchLine.status == LineStatus.RUNNING.value, BatchLine.lease_expires_at < now)
    num_moved = 0
    for batch_filter, status in ((CANCELLING, LineStatus.CANCELLED), (EXPIRING, LineStatus.EXPIRED)):
        num_moved += _update(
            session,
            (*lapsed, BatchLine.batch_id.in_(select(BatchRecord.id).where(batch_filter))),
            status=status.value,
            finished_at=now,
        )
    num_moved += _update(
        session,
        (*lapsed, BatchLine.attempts >= config.batch_max_attempts),
        status=LineStatus.FAILED.value,
        error=WORKER_LOST,
        finished_at=now,
    )
    waiting_again = {"status": LineStatus.QUEUED.value, "chunk_id": None, "lease_expires_at": None}
    num_moved += _update(session, lapsed, **waiting_again)
    stale = (BatchLine.status == LineStatus.DISPATCHED.value, BatchLine.lease_expires_at < now)
    num_moved += _update(session, stale, **waiting_again)
    return num_moved


def _update(session: Session, conditions: tuple, **values: object) -> int:
    moved = session.execute(update(BatchLine).where(*conditions).values(**values))
    session.commit()
    return moved.rowcount


def begin_expiry(session: Session, now: float) -> list[str]:
    """In-progress batches past their completion window: waiting lines expire now, running ones at their next step."""
    due = session.scalars(
        select(BatchRecord.id).where(
            BatchRecord.status == BatchStatus.IN_PROGRESS.value,
            BatchRecord.expired_at.is_(None),
            BatchRecord.expires_at <= now,
        )
    ).all()
    expiring = []
    for batch_id in due:
        moved = session.execute(
            update(BatchRecord)
            .where(BatchRecord.id == batch_id, BatchRecord.expired_at.is_(None))
            .values(expired_at=int(now))
        )
        session.commit()
        if moved.rowcount == 1:
            logger.info("batch %s passed its completion window; expiring it", batch_id)
            stop_waiting_lines(session, batch_id, LineStatus.EXPIRED)
            expiring.append(batch_id)
    return expiring


def stop_lines_of_stopping_batches(session: Session) -> None:
    """Lines put back in the queue while their batch was being cancelled or expired end like its other lines."""
    for batch_filter, status in ((CANCELLING, LineStatus.CANCELLED), (EXPIRING, LineStatus.EXPIRED)):
        for batch_id in session.scalars(select(BatchRecord.id).where(batch_filter)).all():
            stop_waiting_lines(session, batch_id, status)


def fail_interrupted_validations(session: Session, now: float) -> list[str]:
    """Batches still validating whose validation lease lapsed (the api validating them died), failed with every line
    already in the ledger; returns their ids. A batch from before leases had VALIDATION_TIMEOUT_S."""
    lease_expires_at = func.coalesce(
        BatchRecord.validation_lease_expires_at, BatchRecord.created_at + VALIDATION_TIMEOUT_S
    )
    lapsed = session.scalars(
        select(BatchRecord.id).where(BatchRecord.status == BatchStatus.VALIDATING.value, lease_expires_at < now)
    ).all()
    return [batch_id for batch_id in lapsed if fail_validation(session, batch_id, VALIDATION_INTERRUPTED)]


def batches_without_open_lines(session: Session) -> list[str]:
    has_open_line = (
        select(BatchLine.id)
        .where(BatchLine.batch_id == BatchRecord.id, BatchLine.status.in_(OPEN_LINE_VALUES))
        .exists()
    )
    closable = (BatchStatus.IN_PROGRESS.value, BatchStatus.FINALIZING.value, BatchStatus.CANCELLING.value)
    return list(session.scalars(select(BatchRecord.id).where(BatchRecord.status.in_(closable), ~has_open_line)))
