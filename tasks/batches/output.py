"""Output and error file lines of a batch, rendered from its ledger rows."""

from __future__ import annotations

import json
from typing import Any

from tasks.batches.models import BatchLine, LineStatus
from tasks.messages.completions import completion_body
from tasks.messages.generation import ChoiceResult, Endpoint, Usage, error_status_code

STOPPED_ERRORS = {
    LineStatus.CANCELLED: {"code": "batch_cancelled", "message": "The batch was cancelled before this request ran."},
    LineStatus.EXPIRED: {
        "code": "batch_expired",
        "message": "This request could not be executed before the completion window expired.",
    },
}
WORKER_LOST = {
    "message": "The workers running this request stopped too many times.",
    "type": "server_error",
    "param": None,
    "code": "worker_lost",
}


def output_line(line: BatchLine) -> dict[str, Any]:
    """The line of a completed request in the output file."""
    request = line.request or {}
    body = completion_body(
        request_id=line.request_id,
        endpoint=Endpoint(request["endpoint"]),
        model=request["model"],
        created=int(request["created"]),
        text=line.text or "",
        finish_reason=line.finish_reason,
        usage=Usage(line.prompt_tokens, line.completion_tokens),
        logprobs=line.logprobs,
        prompt_logprobs=line.prompt_logprobs,
        steering=line.steering,
        monitor=line.monitor,
        extra_choices=[ChoiceResult.from_dict(choice) for choice in line.extra_choices or []],
        tool_parser=request.get("tool_parser"),
    )
    response = {"status_code": 200, "request_id": line.request_id, "body": body}
    return {"id": _line_id(line), "custom_id": line.custom_id, "response": response, "error": None}


def error_line(line: BatchLine) -> dict[str, Any]:
    """The line of an invalid, failed, cancelled or expired request in the error file."""
    status = LineStatus(line.status)
    if status in STOPPED_ERRORS:
        return {"id": _line_id(line), "custom_id": line.custom_id, "response": None, "error": STOPPED_ERRORS[status]}
    error = line.error or {}
    if line.request is None:  # refused by validation: never ran, so there is no response
        return {"id": _line_id(line), "custom_id": line.custom_id, "response": None, "error": error}
    status_code = error_status_code(error.get("type"))  # a request the worker refused is the client's to fix
    response = {"status_code": status_code, "request_id": line.request_id, "body": {"error": error}}
    return {"id": _line_id(line), "custom_id": line.custom_id, "response": response, "error": None}


def render_jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def _line_id(line: BatchLine) -> str:
    return "batch_req_" + line.request_id.rsplit("-", 1)[-1]
