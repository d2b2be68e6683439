"""OpenAI's `response` object and its output items, built from a stored response and the request that ran it (or, for a
Batch API line, from the same records made from its ledger row)."""

from __future__ import annotations

import hashlib
from typing import Any

from tasks.messages.generation import FinishReason
from tasks.messages.tool_calls import parse_reply
from tasks.store.models import RequestRecord, RequestStatus
from tasks.store.response_models import ResponseRecord

STATUS_OF_REQUEST = {
    RequestStatus.QUEUED: "queued",
    RequestStatus.RUNNING: "in_progress",
    RequestStatus.FAILED: "failed",
    RequestStatus.CANCELLED: "cancelled",
}
UNFINISHED_ITEM_STATUS = {"incomplete": "incomplete", "cancelled": "incomplete", "failed": "incomplete"}


def item_id(prefix: str, response_id: str, output_index: int) -> str:
    """Deterministic, so a stream, its replay and the stored response name an output item alike."""
    return f"{prefix}_" + hashlib.sha256(f"{response_id}:{output_index}".encode()).hexdigest()[:32]


def tool_call_prefix(record: ResponseRecord) -> str:
    """What the worker derives call ids from (choice 0 of the request), so the stream and the stored reply agree."""
    return f"{record.request_id}:0"


def response_status(request: RequestRecord) -> str:
    status = RequestStatus(request.status)
    if status != RequestStatus.COMPLETED:
        return STATUS_OF_REQUEST[status]
    is_cut_short = request.result is not None and request.result.finish_reason == FinishReason.LENGTH.value
    return "incomplete" if is_cut_short else "completed"


def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`logprobs`: chat's content entries (token, logprob, bytes, top_logprobs), the shape Responses gives them."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(
    record: ResponseRecord,
    output_index: int,
    text: str | None,
    status: str,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`text` None: the item as it opens, before its content part."""
    content = [] if text is None else [text_part(text, logprobs)]
    item_key = item_id("msg", record.id, output_index)
    return {"id": item_key, "type": "message", "status": status, "role": "assistant", "content": content}


def function_call_item(
    record: ResponseRecord, output_index: int, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "id": item_id("fc", record.id, output_index),
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def output_items(record: ResponseRecord, tool_parser: str) -> list[dict[str, Any]]:
    """The reply's text as one message, then its function calls; none until the request has ended."""
    result = record.request.result
    if result is None or result.error is not None:
        return []
    status = response_status(record.request)
    item_status = UNFINISHED_ITEM_STATUS.get(status, "completed")
    has_tools = bool(record.params.get("tools")) or result.finish_reason == FinishReason.TOOL_CALLS.value
    if not has_tools or result.finish_reason == FinishReason.ABORT.value:
        return [message_item(record, 0, result.text, item_status, result.logprobs)]
    is_cut = result.finish_reason == FinishReason.LENGTH.value
    reply = parse_reply(tool_parser, result.text, tool_call_prefix(record), is_cut)
    if not reply.tool_calls:
        return [message_item(record, 0, result.text, item_status, result.logprobs)]
    items = [message_item(record, 0, reply.content, item_status)] if reply.content else []
    for index, call in enumerate(reply.tool_calls):
        call_status = "incomplete" if is_cut and index == len(reply.tool_calls) - 1 else "completed"
        items.append(function_call_item(record, len(items), call.id, call.name, call.arguments, call_status))
    return items


INPUT_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def input_item_objects(record: ResponseRecord) -> list[dict[str, Any]]:
    """The items the response was given (its conversation's earlier turns, then its input), oldest first, each with
    an id: its own when it was given one, else one derived from the response and its place."""
    items = []
    for index, stored in enumerate(record.input_items):
        kind = stored.get("type", "message")
        item = {"type": kind, **stored}
        item.setdefault("id", item_id(INPUT_ITEM_PREFIX[kind], f"{record.id}:input", index))
        if kind == "message":
            item.setdefault("status", "completed")
        items.append(item)
    return items


def usage_object(request: RequestRecord) -> dict[str, Any] | None:
    result = request.result
    if result is None:
        return None
    cached = int((result.usage_details or {}).get("cached_tokens", 0))
    return {
        "input_tokens": request.prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": request.prompt_tokens + result.completion_tokens,
    }


def response_object(record: ResponseRecord, tool_parser: str, in_flight_status: str | None = None) -> dict[str, Any]:
    """The response as it stands; `in_flight_status` gives the snapshot a stream opens with instead (no output)."""
    request, params = record.request, record.params
    status = in_flight_status or response_status(request)
    is_snapshot = in_flight_status is not None
    error = request.result.error if request.result is not None and not is_snapshot else None
    return {
        "id": record.id,
        "object": "response",
        "created_at": record.created_at,
        "status": status,
        "background": record.background,
        "error": None if error is None else {"code": error.get("code") or error["type"], "message": error["message"]},
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": record.instructions,
        "max_output_tokens": params.get("max_output_tokens"),
        "max_tool_calls": params.get("max_tool_calls"),
        "model": request.model,
        "output": [] if is_snapshot else output_items(record, tool_parser),
        "parallel_tool_calls": params.get("parallel_tool_calls", True),
        "previous_response_id": record.previous_response_id,
        "conversation": params.get("conversation"),
        "reasoning": {"effort": None, "summary": None},
        "store": record.store,
        "temperature": params.get("temperature"),
        "text": params.get("text"),
        "tool_choice": params.get("tool_choice"),
        "tools": params.get("tools", []),
        "top_logprobs": params.get("top_logprobs"),
        "top_p": params.get("top_p"),
        "truncation": "disabled",
        "usage": None if is_snapshot else usage_object(request),
        "user": params.get("user"),
        "metadata": params.get("metadata") or {},
    }
