"""The non-streamed completion object, shared by the api's responses and the Batch API's output lines."""

from __future__ import annotations

from typing import Any

from tasks.messages import Endpoint, Usage


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
) -> dict[str, Any]:
    """OpenAI's `chat.completion` or `text_completion` object with one choice."""
    choice_logprobs = choice_logprobs_of(endpoint, logprobs)
    if endpoint == Endpoint.CHAT:
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "logprobs": choice_logprobs, "finish_reason": finish_reason}
        object_name = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": choice_logprobs, "finish_reason": finish_reason}
        object_name = "text_completion"
    return {
        "id": request_id,
        "object": object_name,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage.to_dict(),
        "system_fingerprint": None,
    }


def choice_logprobs_of(
    endpoint: Endpoint, entries: list[dict[str, Any]] | None, text_offset: int = 0
) -> dict[str, Any] | None:
    """A choice's `logprobs`, from chat's `content` entries (as the worker records them): chat keeps them,
    completions get the legacy lists, with `text_offset` counted from the first entry's position in the text."""
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
        "top_logprobs": [{top["token"]: top["logprob"] for top in entry["top_logprobs"]} for entry in entries],
        "text_offset": offsets,
    }
