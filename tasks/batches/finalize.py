"""Closing a batch: its output and error files and its final status, committed in one transaction."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tasks.batches.models import OPEN_LINE_VALUES, BatchLine, BatchRecord, BatchStatus, FileRecord, LineStatus
from tasks.batches.output import error_line, output_line, render_jsonl
from tasks.batches.store import count_open_lines, new_sortable_id, stop_status

OUTPUT_PURPOSE = "batch_output"
CLOSED_AT = {
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.CANCELLED: "cancelled_at",
    BatchStatus.FAILED: "failed_at",
}


def finalize_if_done(session: Session, batch_id: str) -> bool:
    """Close a batch none of whose lines is still open; True if this call closed it (racing callers close it once)."""
    batch = session.get(BatchRecord, batch_id, populate_existing=True)
    if batch is None or batch.is_finished or batch.status == BatchStatus.VALIDATING.value:
        return False
    if count_open_lines(session, batch_id):
        return False
    final = _final_status(batch)
    if final == BatchStatus.COMPLETED and batch.status == BatchStatus.IN_PROGRESS.value:
        moved = session.execute(
            update(BatchRecord)
            .where(BatchRecord.id == batch_id, BatchRecord.status == BatchStatus.IN_PROGRESS.value)
            .values(status=BatchStatus.FINALIZING.value, finalizing_at=int(time.time()))
        )
        session.commit()
        if moved.rowcount != 1:
            return False
        return close_batch(session, batch_id, BatchStatus.FINALIZING, final)
    return close_batch(session, batch_id, BatchStatus(batch.status), final)


def _final_status(batch: BatchRecord) -> BatchStatus:
    stopped = stop_status(batch)
    if stopped == LineStatus.CANCELLED:
        return BatchStatus.CANCELLED
    if stopped == LineStatus.EXPIRED:
        return BatchStatus.EXPIRED
    return BatchStatus.COMPLETED


def close_batch(session: Session, batch_id: str, expected: BatchStatus, final: BatchStatus) -> bool:
    """Write the files and move `expected` -> `final`; False, writing nothing, if the batch was no longer `expected`."""
    values: dict[str, object] = {"status": final.value, **_write_files(session, batch_id)}
    if final in CLOSED_AT:
        values[CLOSED_AT[final]] = int(time.time())
    moved = session.execute(
        update(BatchRecord).where(BatchRecord.id == batch_id, BatchRecord.status == expected.value).values(**values)
    )
    if moved.rowcount != 1:
        session.rollback()
        return False
    session.commit()
    return True


def fail_validation(session: Session, batch_id: str, error: dict[str, Any]) -> bool:
    """validating -> failed with `error`, each line already in the ledger failed with it unless it had failed
    validation, and the files written, in one transaction; False if the batch was no longer validating."""
    now = time.time()
    moved = session.execute(
        update(BatchRecord)
        .where(BatchRecord.id == batch_id, BatchRecord.status == BatchStatus.VALIDATING.value)
        .values(status=BatchStatus.FAILED.value, failed_at=int(now), errors=[error])
    )  # the batch row first: on PostgreSQL a validator's next slice then waits, and finds it failed
    if moved.rowcount != 1:
        session.rollback()
        return False
    session.execute(
        update(BatchLine)
        .where(BatchLine.batch_id == batch_id, BatchLine.status.in_(OPEN_LINE_VALUES))
        .values(status=LineStatus.FAILED.value, error=error, finished_at=now)
    )
    session.expire_all()  # lines this session had loaded must load again, failed
    file_ids = _write_files(session, batch_id)
    if file_ids:
        session.execute(update(BatchRecord).where(BatchRecord.id == batch_id).values(**file_ids))
    session.commit()
    return True


def _write_files(session: Session, batch_id: str) -> dict[str, str]:
    """The batch's output and error files, added to the session; their ids by the batch column that names them."""
    tenant, expires_after_s = session.execute(
        select(BatchRecord.tenant, BatchRecord.output_expires_after_s).where(BatchRecord.id == batch_id)
    ).one()  # the batch's tenant owns its files too
    lines = session.scalars(select(BatchLine).where(BatchLine.batch_id == batch_id).order_by(BatchLine.line_no)).all()
    outputs = [output_line(line) for line in lines if line.status == LineStatus.COMPLETED.value]
    errors = [error_line(line) for line in lines if line.status != LineStatus.COMPLETED.value]
    now = int(time.time())
    file_ids: dict[str, str] = {}
    for column, suffix, rows in (("output_file_id", "output", outputs), ("error_file_id", "error", errors)):
        if rows:
            content = render_jsonl(rows)
            file = FileRecord(
                id=new_sortable_id("file-"),
                tenant=tenant,
                purpose=OUTPUT_PURPOSE,
                filename=f"{batch_id}_{suffix}.jsonl",
                bytes=len(content),
                created_at=now,
                content=content,
                expires_at=None if expires_after_s is None else now + expires_after_s,
            )
            session.add(file)
            file_ids[column] = file.id
    session.flush()
    return file_ids
