"""The request bodies of Anthropic's Messages API (`POST /v1/messages` and `/v1/messages/count_tokens`), validated
with pydantic. Unknown top-level fields are refused; inside content blocks, tools and the system prompt unknown
fields (`cache_control`, `citations`, ...) are ignored, as a replayed history carries them. Blocks the served
text-only models cannot read (images, documents, server tools' blocks) are refused, naming the message."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from api.chat.schemas import MAX_STOP_STRINGS
from api.gate.lenient_fields import ReplayedModel
from api.steering.schemas import MonitorBody, SteeringBody
from api.structured.schemas import FUNCTION_NAME, MAX_TOOLS, StrictModel

MAX_MESSAGES = 2048
TOOL_CHOICE_TYPES = ("auto", "any", "tool", "none")
READ_BLOCKS = ("text", "tool_use", "tool_result")
DROPPED_BLOCKS = ("thinking", "redacted_thinking")  # an earlier reply's reasoning, replayed: the model is not shown it


class TextBlock(ReplayedModel):
    type: Literal["text"]
    text: str


class ToolUseBlock(ReplayedModel):
    """A call the assistant made, given back in the history."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str
    input: dict[str, Any]


def _as_text_blocks(content: Any) -> Any:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


class ToolResultBlock(ReplayedModel):
    """What a call returned; `is_error`: the call failed, which the model is shown (api/messages/conversion.py)."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: Annotated[
        list[TextBlock], BeforeValidator(_as_text_blocks, json_schema_input_type=str | list[TextBlock])
    ] = Field(default_factory=list)
    is_error: bool | None = None


class ThinkingBlock(ReplayedModel):
    type: Literal["thinking", "redacted_thinking"]


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]


def _as_blocks(content: Any) -> Any:
    """A string is one text block; a block of a kind the model cannot read is refused by name."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    for index, block in enumerate(content if isinstance(content, list) else []):
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(kind, str) and kind not in READ_BLOCKS + DROPPED_BLOCKS:
            raise ValueError(
                f"content block {index} is a {kind!r} block; the served model reads text only "
                f"({', '.join(READ_BLOCKS)} blocks)"
            )
    return content


class MessageParam(ReplayedModel):
    role: Literal["user", "assistant"]
    content: Annotated[list[ContentBlock], BeforeValidator(_as_blocks, json_schema_input_type=str | list[ContentBlock])]

    @model_validator(mode="after")
    def _check_block_roles(self) -> MessageParam:
        kinds = {block.type for block in self.content}
        if self.role == "user" and "tool_use" in kinds:
            raise ValueError("tool_use blocks belong in assistant messages")
        if self.role == "assistant" and "tool_result" in kinds:
            raise ValueError("tool_result blocks belong in user messages")
        return self


class ToolParam(ReplayedModel):
    """A client tool; server tools (web search, bash, ...) have another `type` and are refused."""

    name: str = Field(pattern=FUNCTION_NAME)
    input_schema: dict[str, Any] = Field(description='a JSON schema of `"type": "object"`, as Anthropic requires')
    description: str | None = None
    type: Literal["custom"] | None = None

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        if schema.get("type") != "object":
            raise ValueError('the input schema must be of "type": "object"')
        return schema


class ToolChoice(StrictModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # type "tool": the tool to call
    disable_parallel_tool_use: bool | None = None  # true: at most one call (auto), exactly one (any, tool)

    @model_validator(mode="after")
    def _name_with_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("tool_choice names a tool exactly when its type is 'tool'")
        return self


class ThinkingConfig(ReplayedModel):
    """Only "disabled": the served models do not reason before they answer."""

    type: Literal["enabled", "disabled", "adaptive"]

    @field_validator("type")
    @classmethod
    def _disabled_only(cls, kind: str) -> str:
        if kind != "disabled":
            raise ValueError("the served model does not think before it answers; send type 'disabled' or no thinking")
        return kind


class Metadata(StrictModel):
    user_id: str | None = Field(None, max_length=256)


class MessagesInput(StrictModel):
    """What both routes read: the conversation and the tools offered."""

    model: str
    messages: list[MessageParam] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: Annotated[
        list[TextBlock] | None, BeforeValidator(_as_text_blocks, json_schema_input_type=str | list[TextBlock] | None)
    ] = None
    tools: list[ToolParam] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    cache_control: dict[str, Any] | None = None  # accepted: the prefix cache reuses every prompt's blocks by itself


class MessageCreateRequest(MessagesInput):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_STRINGS)
    stream: bool = False
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, description="0: off")
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # every request is served alike
    # steerbatch's own, as on chat: SAE steering (features: [] is explicitly unsteered) and per-request monitoring
    steering: SteeringBody | None = None
    monitor: MonitorBody | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _non_empty_stops(cls, stops: list[str] | None) -> list[str] | None:
        if any(not stop for stop in stops or ()):
            raise ValueError("stop sequences must not be empty")
        return stops


class MessageCountTokensRequest(MessagesInput):
    pass
