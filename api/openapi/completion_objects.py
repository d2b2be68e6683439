"""The generation endpoints' response objects as pydantic models, for the OpenAPI document only: the views build
these bodies as dicts (api/chat/objects.py, tasks/messages/completions.py); these models describe them, and the
schemathesis run
against a live server checks that the two agree."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

FinishReason = Literal["stop", "length", "abort", "tool_calls", "function_call"]  # function_call: legacy functions


class ErrorBody(BaseModel):
    message: str
    type: str = Field(description="e.g. invalid_request_error, server_error, service_unavailable, timeout")
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error shape: every 4xx and 5xx answer of the api, and a stream's error event."""

    error: ErrorBody


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="prompt tokens served by the prefix cache")


class CompletionTokensDetails(BaseModel):
    accepted_prediction_tokens: int = Field(description="tokens speculative decoding proposed and kept")
    rejected_prediction_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] = Field(description="the token's UTF-8 bytes (a token may hold part of a character)")


class TokenLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprobEntry]
    refusal: None = None


class CompletionLogprobs(BaseModel):
    """The legacy completions shape; an echoed prompt's first token has no logprob (null) and no top_logprobs."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int] = Field(description="where each token starts in the choice's text")


class PromptTokenLogprob(BaseModel):
    logprob: float
    rank: int = Field(description="1: the most likely token")
    decoded_token: str


PromptLogprobs = list[dict[str, PromptTokenLogprob] | None]
PROMPT_LOGPROBS = Field(
    None,
    description="vLLM's, when asked for: per prompt token (null for the first), by token id, the prompt's token and "
    "the most likely ones",
)


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="a JSON text")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = Field(None, description="a legacy `functions` request's call")


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None
    prompt_logprobs: PromptLogprobs | None = PROMPT_LOGPROBS


class SteeringFeatureReport(BaseModel):
    index: int
    strength: float


class SteeringVectorReport(BaseModel):
    layer: int
    strength: float
    path: str | None


class SteeringReport(BaseModel):
    """steerbatch's own: the steering that ran, and whether the request, its tenant's or the worker's profile set
    it."""

    sae_id: str | None
    features: list[SteeringFeatureReport]
    vectors: list[SteeringVectorReport]
    source: str


class MonitoredFeature(BaseModel):
    index: int
    value: float


class MonitoredToken(BaseModel):
    position: int
    token_id: int
    token: str
    features: list[MonitoredFeature]


class MonitorReport(BaseModel):
    """steerbatch's own: the monitored SAE features at each monitored position."""

    sae_id: str
    top_k: int
    features: list[int] | None
    positions: Literal["prompt", "completion", "all", "last"]
    tokens: list[MonitoredToken]


class _CompletionEnvelope(BaseModel):
    id: str
    created: int
    model: str
    usage: Usage
    system_fingerprint: None = None
    steering: SteeringReport | None = None
    monitor: MonitorReport | None = None


class ChatCompletion(_CompletionEnvelope):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    service_tier: Literal["default"] = Field(description="every request is served alike, whatever tier it asked for")
    prompt_logprobs: PromptLogprobs | None = PROMPT_LOGPROBS


class TextCompletion(_CompletionEnvelope):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str]


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    function_call: dict[str, str] | None = Field(None, description="a legacy `functions` request's call, in parts")


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class _ChunkEnvelope(BaseModel):
    id: str
    created: int
    model: str
    usage: Usage | None = Field(None, description="with stream_options.include_usage: null, then a last usage chunk")
    steering: SteeringReport | None = None
    monitor: MonitorReport | None = None


class ChatCompletionChunk(_ChunkEnvelope):
    """One `data:` event of a chat stream; the stream ends with `data: [DONE]`, or an ErrorResponse event."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChatChunkChoice]
    service_tier: Literal["default"]
    prompt_logprobs: PromptLogprobs | None = Field(None, description="on the first chunk, when asked for")


class TextCompletionChunk(_ChunkEnvelope):
    """One `data:` event of a completions stream; the stream ends with `data: [DONE]`, or an ErrorResponse event."""

    object: Literal["text_completion"]
    choices: list[CompletionChoice]


class RequestObject(BaseModel):
    """steerbatch's own: a chat or completions request by id, with its response or error once it finished."""

    id: str
    object: Literal["request"]
    endpoint: Literal["chat.completions", "completions"]
    model: str
    status: Literal["queued", "running", "completed", "failed", "cancelled"]
    created: int
    metadata: dict[str, str] | None = Field(description="as the request gave it")
    response: ChatCompletion | TextCompletion | None
    error: ErrorBody | None
