"""The non-streamed completion object, shared by the api's responses and the Batch API's output lines."""

from __future__ import annotations

from typing import Any

from tasks.messages import Endpoint, Usage


def completion_body(
    *, request_id: str, endpoint: Endpoint, model: str, created: int, text: str, finish_reason: str | None, usage: Usage
) -> dict[str, Any]:
    """OpenAI's `chat.completion` or `text_completion` object with one choice."""
    if endpoint == Endpoint.CHAT:
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        object_name = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
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
