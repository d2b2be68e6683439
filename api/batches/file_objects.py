"""OpenAI's file object, from a file row."""

from __future__ import annotations

from typing import Any

from tasks.batches.models import FileRecord


def file_object(record: FileRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": record.expires_at,
    }
