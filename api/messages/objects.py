"""Anthropic's `message` object, its content blocks, stop reasons, usage and errors, made from the chat completion a
request ran as (api/chat/objects.py completion_object) and from its stream events."""

from __future__ import annotations

from typing import Any

from pydantic_core import from_json

from api.chat.objects import completion_object
from tasks.messages.generation import ErrorInfo, FinishReason
from tasks.store.models import RequestRecord

# Anthropic's error type for each HTTP status this server answers with (others: by their class)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
STREAM_ERROR_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "timeout": "timeout_error",
    "service_unavailable": "overloaded_error",
}
CHAT_ID_PREFIX = "chatcmpl-"


def message_id(request_id: str) -> str:
    """The message's id: its request's (GET /v1/requests/chatcmpl-<hex>), as Anthropic spells ids."""
    return "msg_" + request_id.removeprefix(CHAT_ID_PREFIX)


def error_body(status: int, message: str) -> dict[str, Any]:
    error_type = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": error_type, "message": message}}


def stream_error(info: ErrorInfo) -> dict[str, Any]:
    """An error met while streaming (in OpenAI's types, as the worker records it), as Anthropic's error event."""
    error_type = STREAM_ERROR_TYPES.get(info.type, "api_error")
    return {"type": "error", "error": {"type": error_type, "message": info.message}}


def split_stop_sequence(text: str, stop_sequences: list[str]) -> tuple[str, str | None]:
    """(the text without the stop sequence it ends with, that sequence): a text ends with one only when it stopped
    it, since the text leading up to a stop never holds a whole stop sequence."""
    ending = max((stop for stop in stop_sequences if text.endswith(stop)), key=len, default=None)
    return (text, None) if ending is None else (text[: -len(ending)], ending)


def stop_reason(finish_reason: str | None, has_tool_use: bool, stop_sequence: str | None) -> str | None:
    """None: the request was cancelled before it ended."""
    if finish_reason == FinishReason.LENGTH.value:
        return "max_tokens"
    if finish_reason in (None, FinishReason.ABORT.value):
        return None
    if has_tool_use:
        return "tool_use"
    return "end_turn" if stop_sequence is None else "stop_sequence"


def tool_input(arguments: str, is_cut: bool) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's `input` is; a call max_tokens cut is read as far as it got."""
    try:
        value = from_json(arguments, allow_partial="trailing-strings" if is_cut else False)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def usage_object(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """Anthropic counts the prompt tokens the prefix cache served apart from the rest; none are written to a cache
    on request."""
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": None,
        "cache_read_input_tokens": cached_tokens,
    }


def message_shell(record: RequestRecord) -> dict[str, Any]:
    """The message as a stream opens it: no content, no stop reason, its input counted."""
    return {
        "id": message_id(record.id),
        "type": "message",
        "role": "assistant",
        "model": record.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage_object(record.prompt_tokens, 0, 0),
    }


def message_object(record: RequestRecord, tool_parser: str) -> dict[str, Any]:
    """The non-streamed response of a finished request."""
    completion = completion_object(record, tool_parser)
    choice = completion["choices"][0]
    finish_reason = choice["finish_reason"]
    text, stop_sequence = split_stop_sequence(choice["message"]["content"] or "", record.body.get("stop") or [])
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    calls = choice["message"].get("tool_calls") or []
    is_cut = finish_reason == FinishReason.LENGTH.value
    for call in calls:
        function = call["function"]
        block = {"type": "tool_use", "id": call["id"], "name": function["name"]}
        content.append({**block, "input": tool_input(function["arguments"], is_cut)})
    usage = completion["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    reports = {name: completion[name] for name in ("steering", "monitor") if name in completion}
    return {
        **message_shell(record),
        "content": content,
        "stop_reason": stop_reason(finish_reason, bool(calls), stop_sequence),
        "stop_sequence": stop_sequence,
        "usage": usage_object(usage["prompt_tokens"], usage["completion_tokens"], cached),
        **reports,
    }
