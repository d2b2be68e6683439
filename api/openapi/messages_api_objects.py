"""Anthropic's Messages API objects, stream events and error shape as pydantic models, for the OpenAPI document only:
api/messages/objects.py and api/messages/events.py build them as dicts; the schemathesis run checks that they
agree."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextContent(BaseModel):
    type: Literal["text"]
    text: str


class ToolUseContent(BaseModel):
    type: Literal["tool_use"]
    id: str = Field(description="what the tool_result block that answers it names as tool_use_id")
    name: str
    input: dict[str, Any] = Field(description="empty as a stream opens the block; its input_json_delta fills it")


class MessageUsage(BaseModel):
    input_tokens: int = Field(description="prompt tokens the prefix cache did not serve")
    output_tokens: int
    cache_creation_input_tokens: None = Field(description="nothing is written to a cache on request")
    cache_read_input_tokens: int = Field(description="prompt tokens served by the prefix cache")


class Message(BaseModel):
    """A reply: its text, then its tool calls; steerbatch's `steering` and `monitor` reports when it asked for
    them."""

    id: str = Field(description="msg_<hex>: its request is chatcmpl-<hex> (GET /v1/requests/{id})")
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[TextContent | ToolUseContent]
    stop_reason: StopReason | None = Field(description="null while streaming, or when the request was cancelled")
    stop_sequence: str | None
    usage: MessageUsage
    steering: dict[str, Any] | None = None
    monitor: dict[str, Any] | None = None


class MessageTokenCount(BaseModel):
    input_tokens: int


class AnthropicErrorBody(BaseModel):
    type: str = Field(description="e.g. invalid_request_error, authentication_error, not_found_error, api_error")
    message: str = Field(description="names the field at fault, for a request refused for one")


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error shape: every 4xx and 5xx answer of the Messages API, and its stream's error event."""

    type: Literal["error"]
    error: AnthropicErrorBody


class MessageStartEvent(BaseModel):
    type: Literal["message_start"]
    message: Message


class PingEvent(BaseModel):
    type: Literal["ping"]


class ContentBlockStartEvent(BaseModel):
    type: Literal["content_block_start"]
    index: int
    content_block: TextContent | ToolUseContent


class TextDelta(BaseModel):
    type: Literal["text_delta"]
    text: str


class InputJsonDelta(BaseModel):
    type: Literal["input_json_delta"]
    partial_json: str


class ContentBlockDeltaEvent(BaseModel):
    type: Literal["content_block_delta"]
    index: int
    delta: TextDelta | InputJsonDelta


class ContentBlockStopEvent(BaseModel):
    type: Literal["content_block_stop"]
    index: int


class StopDelta(BaseModel):
    stop_reason: StopReason | None
    stop_sequence: str | None


class MessageDeltaEvent(BaseModel):
    type: Literal["message_delta"]
    delta: StopDelta
    usage: MessageUsage
    steering: dict[str, Any] | None = None
    monitor: dict[str, Any] | None = None


class MessageStopEvent(BaseModel):
    type: Literal["message_stop"]


MESSAGE_EVENTS = (
    MessageStartEvent,
    PingEvent,
    ContentBlockStartEvent,
    ContentBlockDeltaEvent,
    ContentBlockStopEvent,
    MessageDeltaEvent,
    MessageStopEvent,
    AnthropicErrorResponse,
)
