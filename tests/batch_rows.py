"""A queued batch_lines row, as the api's validation would leave it, for ledger and chunk-runner tests."""

from __future__ import annotations

from tasks.batch_models import LineStatus
from tasks.messages import GenerateRequest


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
