"""OpenAI's batch object, and the rows a batch's input file becomes."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.orm import Session

from api.batches.lines import ParsedLine
from tasks.batches.models import BatchRecord, LineStatus
from tasks.batches.store import new_id, request_counts

TIMESTAMPS = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


def batch_object(session: Session, batch: BatchRecord) -> dict[str, Any]:
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        **{name: getattr(batch, name) for name in TIMESTAMPS},
        "request_counts": request_counts(session, batch.id).to_dict(),
        "metadata": batch.batch_metadata,
    }


def line_row(batch_id: str, line: ParsedLine) -> dict[str, Any]:
    """The ledger row of one input line: queued with its request, or already failed with its validation error."""
    row: dict[str, Any] = {
        "batch_id": batch_id,
        "line_no": line.line_no,
        "custom_id": line.custom_id,
        "attempts": 0,
        "completion_tokens": 0,
    }
    if line.request is None:
        return {
            **row,
            "request_id": new_id("line-"),
            "status": LineStatus.FAILED.value,
            "request": None,
            "prompt_tokens": 0,
            "error": line.error,
            "finished_at": time.time(),
        }
    return {
        **row,
        "request_id": line.request.request_id,
        "status": LineStatus.QUEUED.value,
        "request": line.request.to_dict(),
        "prompt_tokens": line.request.num_prompt_tokens,
        "error": None,
        "finished_at": None,
    }
