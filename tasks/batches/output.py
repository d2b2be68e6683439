"""Output and error file lines of a batch, rendered from its ledger rows."""

from __future__ import annotations

import json
from typing import Any

from tasks.batches.models import BatchLine, LineStatus
from tasks.messages.completions import as_legacy_function_calls, completion_body
from tasks.messages.embeddings import EmbedRequest, embedding_answer, is_embed_request
from tasks.messages.generation import ChoiceResult, Endpoint, Usage, error_status_code
from tasks.messages.response_objects import response_object
from tasks.store.models import RequestRecord, RequestStatus, ResultRecord
from tasks.store.response_models import ResponseRecord

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
    if is_embed_request(request):
        body = embedding_answer(EmbedRequest.from_dict(request), line.text or "")
    elif "response" in request:  # a /v1/responses line (tasks/batches/messages.py: ResponseLine)
        body = _response(line, request)
    else:
        body = _completion(line, request)
    response = {"status_code": 200, "request_id": line.request_id, "body": body}
    return {"id": _line_id(line), "custom_id": line.custom_id, "response": response, "error": None}


def _completion(line: BatchLine, request: dict[str, Any]) -> dict[str, Any]:
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
    if request.get("is_legacy_functions"):
        as_legacy_function_calls(body)
    return body


def _response(line: BatchLine, request: dict[str, Any]) -> dict[str, Any]:
    """The response object, built by the one builder the Responses API answers with, from unsaved records holding
    what the ledger row holds: the line's result, and the response's id, instructions, input and echoed params."""
    response = request["response"]
    result = ResultRecord(
        request_id=line.request_id,
        text=line.text or "",
        finish_reason=line.finish_reason,
        completion_tokens=line.completion_tokens,
        logprobs=line.logprobs,
    )
    ran = RequestRecord(
        id=line.request_id,
        model=request["model"],
        status=RequestStatus.COMPLETED.value,
        prompt_tokens=line.prompt_tokens,
        created=int(request["created"]),
        result=result,
    )
    record = ResponseRecord(
        id=response["id"],
        request_id=line.request_id,
        created_at=int(request["created"]),
        store=False,  # a batch line's response is in the output file only
        background=False,
        previous_response_id=None,
        instructions=response["instructions"],
        input_items=response["input_items"],
        params=response["params"],
        request=ran,
    )
    return response_object(record, request.get("tool_parser") or "")


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
