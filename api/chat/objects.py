"""OpenAI response objects and stream chunks, built from SQL records and stream events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.messages.completions import (
    as_legacy_function_calls,
    choice_logprobs_of,
    completion_body,
    service_tier_of,
)
from tasks.messages.generation import (
    ChoiceResult,
    Endpoint,
    EventType,
    FinishReason,
    StreamEvent,
    Usage,
    UsageDetails,
)
from tasks.store.models import RequestRecord


@dataclass(frozen=True)
class StreamMeta:
    """What every chunk of one request's stream repeats."""

    request_id: str
    endpoint: Endpoint
    model: str
    created: int
    include_usage: bool
    is_legacy_functions: bool = False  # the request offered `functions`: a call is answered as `function_call`
    return_token_ids: bool = False  # vLLM's: every DELTA with tokens makes a chunk, carrying their ids

    @classmethod
    def of(cls, record: RequestRecord) -> StreamMeta:
        options = record.body.get("stream_options") or {}
        is_legacy = "functions" in record.body
        endpoint = Endpoint(record.endpoint)
        include_usage, return_token_ids = bool(options.get("include_usage")), bool(record.body.get("return_token_ids"))
        return cls(record.id, endpoint, record.model, record.created, include_usage, is_legacy, return_token_ids)

    def finish_reason_of(self, event: StreamEvent) -> str | None:
        if self.is_legacy_functions and event.finish_reason == FinishReason.TOOL_CALLS:
            return "function_call"
        return event.finish_reason.value if event.finish_reason else None


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


def stream_chunks(meta: StreamMeta, event: StreamEvent) -> list[dict[str, Any]]:
    """The SSE payloads one stream event becomes (none, one, or the finish and usage chunks)."""
    if event.error is not None:
        return [{"error": event.error.to_dict()}]
    if event.type == EventType.START:
        return [_chunk(meta, {"role": "assistant", "content": ""}, None)] if meta.endpoint == Endpoint.CHAT else []
    if event.type == EventType.DELTA:
        return _delta_chunks(meta, event)
    chunks = [_chunk(meta, {}, meta.finish_reason_of(event))]
    if meta.include_usage and event.usage is not None:
        chunks.append({**_envelope(meta), "choices": [], "usage": event.usage.to_dict()})
    reports = {
        name: report
        for name, report in (("steering", event.steering), ("monitor", event.monitor))
        if report is not None
    }
    if reports:
        chunks.append({**_envelope(meta), "choices": [], **reports})
    return chunks


def _delta_chunks(meta: StreamMeta, event: StreamEvent) -> list[dict[str, Any]]:
    """New text (with its logprobs), then each tool call entry in a chunk of its own, then the finish reason."""
    finish_reason = meta.finish_reason_of(event)
    chunks = []
    has_content = event.text or event.logprobs or event.prompt_logprobs or (meta.return_token_ids and event.token_ids)
    if has_content or (finish_reason and not event.tool_calls):
        logprobs = choice_logprobs_of(meta.endpoint, event.logprobs, event.text_offset) if event.logprobs else None
        delta = {"content": event.text} if event.text or not finish_reason else {}
        last_reason = None if event.tool_calls else finish_reason
        chunk = _chunk(meta, delta, last_reason, text=event.text, logprobs=logprobs, index=event.index)
        if meta.return_token_ids:
            chunk["choices"][0]["token_ids"] = list(event.token_ids)
        if event.prompt_logprobs is not None:  # vLLM's: on the choice's first chunk, where chat's response has them
            owner = chunk if meta.endpoint == Endpoint.CHAT else chunk["choices"][0]
            owner["prompt_logprobs"] = event.prompt_logprobs
        chunks.append(chunk)
    for entry in event.tool_calls:
        delta = {"function_call": entry["function"]} if meta.is_legacy_functions else {"tool_calls": [entry]}
        chunks.append(_chunk(meta, delta, None, index=event.index))
    if event.tool_calls and finish_reason:
        chunks.append(_chunk(meta, {}, finish_reason, index=event.index))
    return chunks


def _chunk(
    meta: StreamMeta,
    delta: dict[str, Any],
    finish_reason: str | None,
    text: str = "",
    logprobs: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    if meta.endpoint == Endpoint.CHAT:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    chunk = {**_envelope(meta), "choices": [choice]}
    if meta.include_usage:
        chunk["usage"] = None
    return chunk


def _envelope(meta: StreamMeta) -> dict[str, Any]:
    object_name = "chat.completion.chunk" if meta.endpoint == Endpoint.CHAT else "text_completion"
    return {
        "id": meta.request_id,
        "object": object_name,
        "created": meta.created,
        "model": meta.model,
        **service_tier_of(meta.endpoint),
    }
