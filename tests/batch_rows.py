"""A queued batch_lines row, and a validating batch's rows accepted, as the api's validation would leave them, for
ledger and chunk-runner tests."""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from tasks.batches.models import LineStatus
from tasks.batches.store import add_lines, start_validated
from tasks.messages.generation import GenerateRequest


def accept_rows(session: Session, batch_id: str, rows: list[dict]) -> bool:
    """Every row into the ledger of a validating batch, then the batch in progress (True) if any row is queued."""
    assert add_lines(session, batch_id, rows, time.time() + 60)
    return start_validated(session, batch_id, [])


def queued_line_row(batch_id: str, line_no: int, request: GenerateRequest) -> dict:
    return {
        "batch_id": batch_id,
        "line_no": line_no,
        "custom_id": f"c{line_no}",
        "request_id": request.request_id,
        "status": LineStatus.QUEUED.value,
        "attempts": 0,
        "request": request.to_dict(),
        "prompt_tokens": len(request.prompt_token_ids),
        "completion_tokens": 0,
        "error": None,
        "finished_at": None,
    }
