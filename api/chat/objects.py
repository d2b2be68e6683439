"""OpenAI response objects built from SQL records (a stream's chunks: tasks/messages/stream_chunks.py)."""

from __future__ import annotations

from typing import Any

from tasks.messages.completions import as_legacy_function_calls, completion_body
from tasks.messages.generation import ChoiceResult, Endpoint, Usage, UsageDetails
from tasks.store.models import RequestRecord


def completion_object(record: RequestRecord, tool_parser: str) -> dict[str, Any]:
    """The non-streamed response of a finished request; `tool_parser` reads the calls of a request that offered
    tools it may call, as the worker read its stream."""
    body = record.body or {}
    may_call = (body.get("tools") or body.get("functions")) and body.get(
        "tool_choice", body.get("function_call")
    ) != "none"
    result = record.result
    assert result is not None, "completion_object needs a finished request"
    completion = completion_body(
        request_id=record.id,
        endpoint=Endpoint(record.endpoint),
        model=record.model,
        created=record.created,
        text=result.text,
        finish_reason=result.finish_reason,
        usage=Usage(record.prompt_tokens, result.completion_tokens, UsageDetails.from_dict(result.usage_details)),
        logprobs=result.logprobs,
        prompt_logprobs=result.prompt_logprobs,
        extra_choices=[ChoiceResult.from_dict(choice) for choice in result.extra_choices or []],
        steering=result.steering,
        monitor=result.monitor,
        tool_parser=tool_parser if may_call else None,
    )
    if "functions" in body:
        as_legacy_function_calls(completion)
    return completion


def request_object(record: RequestRecord, tool_parser: str) -> dict[str, Any]:
    """GET /v1/requests/{id}: status, and the response or error once there is one."""
    result = record.result
    return {
        "id": record.id,
        "object": "request",
        "endpoint": record.endpoint,
        "model": record.model,
        "status": record.status,
        "created": record.created,
        "metadata": record.body.get("metadata"),  # as the request gave it (OpenAI's stored completions return it)
        "response": completion_object(record, tool_parser) if result is not None and result.error is None else None,
        "error": result.error if result is not None else None,
    }
