"""The Responses API's `response` object and its typed stream events as pydantic models, for the OpenAPI document only:
tasks/messages/response_objects.py and api/responses/events.py build them as dicts; the schemathesis run checks that
they agree."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from api.openapi.completion_objects import TokenLogprobEntry

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputText(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(max_length=0)
    logprobs: list[TokenLogprobEntry] = Field(description="empty unless `include` asks for them")


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"]
    status: ItemStatus
    role: Literal["assistant"]
    content: list[OutputText] = Field(description="empty while the item is opening in a stream")


class FunctionCallOutput(BaseModel):
    id: str
    type: Literal["function_call"]
    status: ItemStatus
    call_id: str = Field(description="what the function_call_output item that answers it names")
    name: str
    arguments: str = Field(description="a JSON text")


OutputItem = OutputMessage | FunctionCallOutput


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class InputTokensDetails(BaseModel):
    cached_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: Literal[0] = Field(description="the served models do not reason before they answer")


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class Reasoning(BaseModel):
    effort: None
    summary: None


class ConversationRef(BaseModel):
    id: str


class ResponseObject(BaseModel):
    """A response as it stands: its output and usage once it has ended (none in a stream's opening snapshots), and
    what it repeats of its request."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    background: bool
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: int | None = Field(
        description="the request's, repeated: it bounds built-in tools, of which there are none"
    )
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    conversation: ConversationRef | None = Field(description="the conversation its input and output joined")
    reasoning: Reasoning
    store: bool
    temperature: float | None
    text: dict[str, Any] = Field(description='the request\'s `text`, its format by default {"type": "text"}')
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_logprobs: int | None
    top_p: float | None
    truncation: Literal["disabled"]
    usage: ResponseUsage | None
    user: str | None
    metadata: dict[str, str]


class InputItemList(BaseModel):
    """A response's input items, as its request gave them (an `id` added where it had none)."""

    object: Literal["list"]
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response"]
    deleted: Literal[True]


class _Event(BaseModel):
    sequence_number: int = Field(description="also the event's SSE `id`: resume after it with starting_after")


class ResponseLifecycleEvent(_Event):
    type: Literal[
        "response.created", "response.in_progress", "response.completed", "response.incomplete", "response.failed"
    ]
    response: ResponseObject


class OutputItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class _TextPlace(_Event):
    item_id: str
    output_index: int
    content_index: int


class ContentPartEvent(_TextPlace):
    type: Literal["response.content_part.added", "response.content_part.done"]
    part: OutputText


class OutputTextDeltaEvent(_TextPlace):
    type: Literal["response.output_text.delta"]
    delta: str
    logprobs: list[TokenLogprobEntry]


class OutputTextDoneEvent(_TextPlace):
    type: Literal["response.output_text.done"]
    text: str
    logprobs: list[TokenLogprobEntry]


class FunctionCallArgumentsDeltaEvent(_Event):
    type: Literal["response.function_call_arguments.delta"]
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDoneEvent(_Event):
    type: Literal["response.function_call_arguments.done"]
    item_id: str
    output_index: int
    name: str
    arguments: str


class ResponseErrorEvent(_Event):
    """A stream that cannot go on (timed out, Redis gone); GET the response for how it ended."""

    type: Literal["error"]
    code: str
    message: str
    param: None


RESPONSE_EVENTS = (
    ResponseLifecycleEvent,
    OutputItemEvent,
    ContentPartEvent,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    ResponseErrorEvent,
)
