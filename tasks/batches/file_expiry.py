"""Files past their `expires_at` are gone: unseen at once, deleted (row and bytes) by the reaper's next pass."""

from __future__ import annotations

import logging

from sqlalchemy import ColumnElement, delete, or_
from sqlalchemy.orm import Session

from tasks.batches.models import FileRecord

logger = logging.getLogger(__name__)


def is_live(record: FileRecord, now: int) -> bool:
    return record.expires_at is None or record.expires_at > now


def live_files(now: int) -> ColumnElement[bool]:
    """The SQL condition `is_live` is."""
    return or_(FileRecord.expires_at.is_(None), FileRecord.expires_at > now)


def delete_expired_files(session: Session, now: int) -> int:
    """Deletes every expired file; returns how many. Any number of reapers may run it at once."""
    deleted = session.execute(delete(FileRecord).where(FileRecord.expires_at <= now))
    session.commit()
    if deleted.rowcount:
        logger.info("deleted %d expired files", deleted.rowcount)
    return deleted.rowcount
