"""A file's bytes read from the database a slice at a time: sending a file holds one slice in memory, not the whole
file, however many clients download it at once."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import func, select

from tasks.batches.models import FileRecord
from tasks.store.db import SessionFactory

CONTENT_SLICE_BYTES = 1 << 20


def iter_file_content(
    sessions: SessionFactory, file_id: str, num_bytes: int, slice_bytes: int = CONTENT_SLICE_BYTES
) -> Iterator[bytes]:
    """The file's `num_bytes` bytes in slices, each read in a session of its own (a slow reader holds no connection
    between slices); stops early if the file is deleted meanwhile."""
    for offset in range(0, num_bytes, slice_bytes):
        # SQL's substr counts from 1, and reads bytes of a BLOB (SQLite) or bytea (PostgreSQL)
        part = func.substr(FileRecord.content, offset + 1, slice_bytes)
        with sessions() as session:
            data = session.scalar(select(part).where(FileRecord.id == file_id))
        if data is None:
            return
        yield bytes(data)
