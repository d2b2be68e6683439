"""The request body of OpenAI's Responses API (`POST /v1/responses`), validated with pydantic; unknown top-level
fields are refused, unknown fields inside input items (replayed output items) are ignored, and the fields clients send
by default that mean nothing here (`user`, `service_tier`, `prompt_cache_key`, `max_tool_calls`, `reasoning`, ...) are
accepted and change nothing."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    field_validator,
    model_validator,
)

from api.chat.openai_extras import Identifier
from api.chat.schemas import MAX_TOP_LOGPROBS
from api.gate.lenient_fields import NULL_IS_DEFAULT, ReplayedModel
from api.structured.schemas import FUNCTION_NAME, MAX_TOOLS, TOOL_CHOICES, StrictModel

MAX_METADATA_PAIRS = 16  # OpenAI's limits on `metadata`
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
MAX_INPUT_ITEMS = 2048
OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs"
# OpenAI's other `include` values name outputs of tools and inputs this server has not (built-in tools, images,
# encrypted reasoning): accepted, adding nothing.
INCLUDABLE = Literal[
    "message.output_text.logprobs", "reasoning.encrypted_content", "file_search_call.results",
    "web_search_call.results", "web_search_call.action.sources", "message.input_image.image_url",
    "computer_call_output.output.image_url", "code_interpreter_call.outputs",
]  # fmt: skip


def check_metadata(metadata: dict[str, str] | None) -> dict[str, str] | None:
    pairs = metadata or {}
    if len(pairs) > MAX_METADATA_PAIRS:
        raise ValueError(f"at most {MAX_METADATA_PAIRS} key-value pairs are allowed")
    if any(len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE for key, value in pairs.items()):
        raise ValueError(f"keys are at most {MAX_METADATA_KEY} characters, values {MAX_METADATA_VALUE}")
    return metadata


Metadata = Annotated[dict[str, str] | None, AfterValidator(check_metadata)]


class InputTextPart(ReplayedModel):
    type: Literal["input_text"]
    text: str


class OutputTextPart(ReplayedModel):
    """A reply's text, as an earlier response's output gives it back."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list, max_length=0)
    logprobs: list[Any] | None = None


ContentPart = Annotated[InputTextPart | OutputTextPart, Field(discriminator="type")]


def _as_text_parts(content: Any) -> Any:
    """A message's content given as a string is one text part; so an error names a part, not a union member."""
    return [{"type": "input_text", "text": content}] if isinstance(content, str) else content


class MessageItem(ReplayedModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Annotated[
        list[ContentPart], BeforeValidator(_as_text_parts, json_schema_input_type=str | list[ContentPart])
    ]
    id: str | None = None  # an output message given back
    status: str | None = None

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content)


class FunctionCallItem(ReplayedModel):
    """A call the model made, given back in a later request's input."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str  # a JSON text
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(ReplayedModel):
    """What a call returned."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str
    id: str | None = None
    status: str | None = None


def _item_kind(item: Any) -> str:
    """A message may leave out `type` (OpenAI's easy input message)."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")
    return kind if kind in ("message", "function_call", "function_call_output") else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_kind),
]
INPUT_ITEMS = TypeAdapter(list[InputItem])


def _as_items(value: Any) -> Any:
    """`input` given as a string is one user message."""
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


class FunctionTool(StrictModel):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None  # forced calls always follow `parameters`


class FunctionToolChoice(StrictModel):
    type: Literal["function"]
    name: str


class AllowedFunction(StrictModel):
    type: Literal["function"]
    name: str


class AllowedToolsToolChoice(StrictModel):
    """The tools the model may call, of those offered (all stay shown to it): freely ("auto") or one at least."""

    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedFunction] = Field(min_length=1, max_length=MAX_TOOLS)


ToolChoice = str | FunctionToolChoice | AllowedToolsToolChoice  # a str: one of TOOL_CHOICES


class TextFormatText(StrictModel):
    type: Literal["text"]


class TextFormatJsonObject(StrictModel):
    type: Literal["json_object"]


class TextFormatJsonSchema(StrictModel):
    type: Literal["json_schema"]
    name: str = Field(pattern=FUNCTION_NAME)
    json_schema: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None  # the grammar always enforces the schema, strict or not


TextFormat = Annotated[TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")]


class TextConfig(StrictModel):
    format: TextFormat = Field(default_factory=lambda: TextFormatText(type="text"))
    verbosity: Literal["low", "medium", "high"] | None = None  # ignored: the models have no such control


class ReasoningConfig(StrictModel):
    """Accepted and ignored: the served model does not reason before it answers."""

    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponseStreamOptions(StrictModel):
    include_obfuscation: bool | None = None  # ignored: events carry no obfuscation padding


class ConversationRef(StrictModel):
    id: str = Field(min_length=1)


def _as_conversation_ref(value: Any) -> Any:
    """`conversation` given as its id."""
    return {"id": value} if isinstance(value, str) else value


class ResponseCreateRequest(StrictModel):
    model: str
    input: Annotated[
        list[InputItem],
        BeforeValidator(_as_items, json_schema_input_type=str | list[InputItem]),
        Field(min_length=1, max_length=MAX_INPUT_ITEMS),
    ]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: Annotated[float, NULL_IS_DEFAULT] = Field(1.0, ge=0.0, le=2.0)
    top_p: Annotated[float, NULL_IS_DEFAULT] = Field(1.0, gt=0.0, le=1.0)
    store: Annotated[bool, NULL_IS_DEFAULT] = True
    metadata: Metadata = None
    stream: Annotated[bool, NULL_IS_DEFAULT] = False
    background: Annotated[bool, NULL_IS_DEFAULT] = False
    previous_response_id: str | None = None
    conversation: Annotated[
        ConversationRef | None,
        BeforeValidator(_as_conversation_ref, json_schema_input_type=str | ConversationRef | None),
    ] = None
    tools: list[FunctionTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    text: TextConfig | None = None
    include: list[INCLUDABLE] | None = None  # OUTPUT_TEXT_LOGPROBS adds the text's logprobs; the rest add nothing
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # accepted, changing nothing
    user: str | None = None
    parallel_tool_calls: bool | None = None
    truncation: Literal["disabled"] | None = None
    reasoning: ReasoningConfig | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    prompt_cache_key: Identifier | None = None  # prefix caching is automatic, by the prompt's tokens
    prompt_cache_retention: Literal["in-memory", "24h"] | None = None
    safety_identifier: Identifier | None = None
    max_tool_calls: int | None = Field(None, ge=1)  # bounds calls to built-in tools, of which there are none
    stream_options: ResponseStreamOptions | None = None

    @property
    def wants_logprobs(self) -> bool:
        return OUTPUT_TEXT_LOGPROBS in (self.include or ()) or self.top_logprobs is not None

    @model_validator(mode="after")
    def _check_one_history(self) -> ResponseCreateRequest:
        if self.conversation is not None and self.previous_response_id is not None:
            raise ValueError(
                "Mutually exclusive parameters: provide only one of 'previous_response_id' or 'conversation'."
            )
        return self

    @field_validator("tool_choice")
    @classmethod
    def _check_tool_choice(cls, choice: ToolChoice | None) -> ToolChoice | None:
        if isinstance(choice, str) and choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or a named function")
        return choice
