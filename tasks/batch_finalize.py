"""Closing a batch: its output and error files and its final status, committed in one transaction."""

from __future__ import annotations

import time

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tasks.batch_models import BatchLine, BatchRecord, BatchStatus, FileRecord, LineStatus
from tasks.batch_output import error_line, output_line, render_jsonl
from tasks.batch_store import count_open_lines, new_id, stop_status

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
    tenant = session.scalar(select(BatchRecord.tenant).where(BatchRecord.id == batch_id))  # owns the files too
    lines = session.scalars(select(BatchLine).where(BatchLine.batch_id == batch_id).order_by(BatchLine.line_no)).all()
    outputs = [output_line(line) for line in lines if line.status == LineStatus.COMPLETED.value]
    errors = [error_line(line) for line in lines if line.status != LineStatus.COMPLETED.value]
    now = int(time.time())
    values: dict[str, object] = {"status": final.value}
    if final in CLOSED_AT:
        values[CLOSED_AT[final]] = now
    for column, suffix, rows in (("output_file_id", "output", outputs), ("error_file_id", "error", errors)):
        if rows:
            content = render_jsonl(rows)
            file = FileRecord(
                id=new_id("file-"),
                tenant=tenant,
                purpose=OUTPUT_PURPOSE,
                filename=f"{batch_id}_{suffix}.jsonl",
                bytes=len(content),
                created_at=now,
                content=content,
            )
            session.add(file)
            values[column] = file.id
    session.flush()
    moved = session.execute(
        update(BatchRecord).where(BatchRecord.id == batch_id, BatchRecord.status == expected.value).values(**values)
    )
    if moved.rowcount != 1:
        session.rollback()
        return False
    session.commit()
    return True
