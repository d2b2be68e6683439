"""A streamed chat or completion request's SSE payloads (OpenAI's chunk objects), made from its stream events.

The worker writes each DELTA's payloads beside the event itself (`encode_chunks`), so that the api relays them as
they are: the chunk JSON is made once per event, in the worker's output pass, instead of the api decoding the event,
building the chunk and encoding it again for every token of every stream (the api's event loop is one core's worth
for every stream it relays)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tasks.messages.completions import choice_logprobs_of, service_tier_of
from tasks.messages.generation import Endpoint, EventType, FinishReason, StreamEvent

if TYPE_CHECKING:
    from tasks.store.models import RequestRecord

PAYLOAD_SEPARATOR = "\n"  # between one event's payloads: JSON text never holds a raw newline


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
        return cls.of_body(record.id, Endpoint(record.endpoint), record.model, record.created, record.body)

    @classmethod
    def of_body(cls, request_id: str, endpoint: Endpoint, model: str, created: int, body: dict) -> StreamMeta:
        """From the request's body as the client sent it, which its row keeps: the api's view and the worker's (the
        meta it was sent with) agree for every relay of the stream, a resumed one included."""
        options = body.get("stream_options") or {}
        include_usage, return_token_ids = bool(options.get("include_usage")), bool(body.get("return_token_ids"))
        return cls(request_id, endpoint, model, created, include_usage, "functions" in body, return_token_ids)

    def finish_reason_of(self, event: StreamEvent) -> str | None:
        if self.is_legacy_functions and event.finish_reason == FinishReason.TOOL_CALLS:
            return "function_call"
        return event.finish_reason.value if event.finish_reason else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "endpoint": self.endpoint.value,
            "model": self.model,
            "created": self.created,
            "include_usage": self.include_usage,
            "is_legacy_functions": self.is_legacy_functions,
            "return_token_ids": self.return_token_ids,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StreamMeta:
        return cls(**{**data, "endpoint": Endpoint(data["endpoint"])})


def encode_chunks(meta: StreamMeta, event: StreamEvent) -> str:
    """The event's SSE payloads as the api sends them, joined by PAYLOAD_SEPARATOR ("" for none)."""
    if is_plain_delta(event):
        return _plain_delta_chunk(meta, event)
    return PAYLOAD_SEPARATOR.join(json.dumps(chunk) for chunk in stream_chunks(meta, event))


def is_plain_delta(event: StreamEvent) -> bool:
    """A DELTA of text and tokens alone: almost every token's, which `_plain_delta_chunk` encodes."""
    return (
        event.type == EventType.DELTA
        and event.finish_reason is None
        and not (event.logprobs or event.tool_calls or event.error)
        and event.prompt_logprobs is None
    )


def _plain_delta_chunk(meta: StreamMeta, event: StreamEvent) -> str:
    """`json.dumps` of `stream_chunks`' one chunk, character for character, without building it: the chunk's
    envelope is the request's, encoded once (about a third of the general path's time, in the worker's pass)."""
    if not (event.text or (meta.return_token_ids and event.token_ids)):
        return ""
    before, after = _plain_delta_frame(meta)
    token_ids = f', "token_ids": {json.dumps(list(event.token_ids))}' if meta.return_token_ids else ""
    text = f"{_TEXT_KEY[meta.endpoint]}{json.dumps(event.text)}{_TEXT_END[meta.endpoint]}"
    return f"{before}{event.index}{text}{token_ids}{after}"


_TEXT_KEY = {Endpoint.CHAT: ', "delta": {"content": ', Endpoint.COMPLETIONS: ', "text": '}
_TEXT_END = {
    Endpoint.CHAT: '}, "logprobs": null, "finish_reason": null',
    Endpoint.COMPLETIONS: ', "logprobs": null, "finish_reason": null',
}


@functools.lru_cache(maxsize=4096)
def _plain_delta_frame(meta: StreamMeta) -> tuple[str, str]:
    """The text of a plain DELTA's chunk before its choice's index, and after its choice's last field."""
    envelope = json.dumps(_envelope(meta))
    after = "}]" + (', "usage": null}' if meta.include_usage else "}")
    return envelope[:-1] + ', "choices": [{"index": ', after


def decode_payloads(encoded: str) -> list[str]:
    return encoded.split(PAYLOAD_SEPARATOR) if encoded else []


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
