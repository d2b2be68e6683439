"""The non-streamed completion object, shared by the api's responses and the Batch API's output lines."""

from __future__ import annotations

from typing import Any

from tasks.messages.generation import ChoiceResult, Endpoint, FinishReason, Usage
from tasks.messages.tool_calls import parse_reply


def completion_body(
    *,
    request_id: str,
    endpoint: Endpoint,
    model: str,
    created: int,
    text: str,
    finish_reason: str | None,
    usage: Usage,
    logprobs: list[dict[str, Any]] | None = None,
    prompt_logprobs: list[dict[str, Any] | None] | None = None,
    extra_choices: list[ChoiceResult] | None = None,
    steering: dict[str, Any] | None = None,
    monitor: dict[str, Any] | None = None,
    tool_parser: str | None = None,
) -> dict[str, Any]:
    """OpenAI's `chat.completion` or `text_completion` object: choice 0, then any further choices of n > 1; plus
    steerbatch's `steering` and `monitor` reports when the request was steered or monitored. A choice that ended in
    tool calls has them parsed from its text by `tool_parser`, as its stream gave them. vLLM's `prompt_logprobs`, when
    asked for, are each completion choice's, and chat's response's (its one prompt's)."""
    first = ChoiceResult(0, text, FinishReason(finish_reason) if finish_reason else None, logprobs, prompt_logprobs)
    choices = [first.to_dict()] + [choice.to_dict() for choice in extra_choices or []]
    reports = {name: report for name, report in (("steering", steering), ("monitor", monitor)) if report is not None}
    if endpoint == Endpoint.CHAT and prompt_logprobs is not None:
        reports["prompt_logprobs"] = prompt_logprobs
    return {
        "id": request_id,
        "object": "chat.completion" if endpoint == Endpoint.CHAT else "text_completion",
        "created": created,
        "model": model,
        "choices": [_choice_object(endpoint, choice, request_id, tool_parser) for choice in choices],
        "usage": usage.to_dict(),
        "system_fingerprint": None,
        **service_tier_of(endpoint),
        **reports,
    }


def service_tier_of(endpoint: Endpoint) -> dict[str, str]:
    """Chat's `service_tier`: every request is served alike, whatever tier it asked for."""
    return {"service_tier": "default"} if endpoint == Endpoint.CHAT else {}


def _choice_object(
    endpoint: Endpoint, choice: dict[str, Any], request_id: str, tool_parser: str | None
) -> dict[str, Any]:
    logprobs = choice_logprobs_of(endpoint, choice["logprobs"])
    if endpoint == Endpoint.CHAT:
        message = _message(choice, f"{request_id}:{choice['index']}", tool_parser)
        return {
            "index": choice["index"],
            "message": message,
            "logprobs": logprobs,
            "finish_reason": choice["finish_reason"],
        }
    shown = {
        "index": choice["index"],
        "text": choice["text"],
        "logprobs": logprobs,
        "finish_reason": choice["finish_reason"],
    }
    if choice.get("prompt_logprobs") is not None:
        shown["prompt_logprobs"] = choice["prompt_logprobs"]
    return shown


def _message(choice: dict[str, Any], id_prefix: str, tool_parser: str | None) -> dict[str, Any]:
    """A reply with tools offered is read for calls whatever it finished with: "stop" after a call to a named
    function, "length" after a call it cut (the last, partial)."""
    if tool_parser is None:
        return {"role": "assistant", "content": choice["text"]}
    is_cut = choice["finish_reason"] == FinishReason.LENGTH.value
    reply = parse_reply(tool_parser, choice["text"], id_prefix, is_cut)
    if not reply.tool_calls:
        return {"role": "assistant", "content": choice["text"]}
    return {"role": "assistant", "content": reply.content, "tool_calls": [call.to_dict() for call in reply.tool_calls]}


def choice_logprobs_of(
    endpoint: Endpoint, entries: list[dict[str, Any]] | None, text_offset: int = 0
) -> dict[str, Any] | None:
    """A choice's `logprobs`, from chat's `content` entries (as the worker records them): chat keeps them,
    completions get the legacy lists, `text_offset` counted on from `text_offset` (where a stream chunk's first
    entry starts in the choice's text). An echoed prompt's first token has no logprob, and so no top_logprobs."""
    if entries is None:
        return None
    if endpoint == Endpoint.CHAT:
        return {"content": entries, "refusal": None}
    offsets = []
    for entry in entries:
        offsets.append(text_offset)
        text_offset += len(entry["token"])
    return {
        "tokens": [entry["token"] for entry in entries],
        "token_logprobs": [entry["logprob"] for entry in entries],
        "top_logprobs": [
            None if entry["logprob"] is None else {top["token"]: top["logprob"] for top in entry["top_logprobs"]}
            for entry in entries
        ],
        "text_offset": offsets,
    }


def as_legacy_function_calls(completion: dict[str, Any]) -> None:
    """A legacy `functions` request's chat completion, in place, as OpenAI answers it: each choice's call as
    `message.function_call` (one call: legacy functions are never parallel) and finish_reason "function_call"."""
    for choice in completion["choices"]:
        calls = choice["message"].pop("tool_calls", None)
        if calls:
            choice["message"]["function_call"] = calls[0]["function"]
        if choice["finish_reason"] == FinishReason.TOOL_CALLS.value:
            choice["finish_reason"] = "function_call"
