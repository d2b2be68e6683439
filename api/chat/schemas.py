"""Request bodies of the OpenAI endpoints, validated with pydantic; unknown fields are refused."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from api.chat.openai_extras import ChatTemplateFields, DetokenizeFields, OpenAIExtras
from api.gate.lenient_fields import NULL_IS_DEFAULT, ReplayedModel
from api.steering.schemas import MonitorBody, SteeringBody
from api.structured.schemas import StrictModel, StructuredFields, ToolCallBody, ToolFields

MAX_STOP_STRINGS = 16
MAX_STOP_TOKEN_IDS = 64
MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 16
MAX_SPECULATIVE_TOKENS = 16
MAX_PROMPTS = 128  # a completion's prompts, and its prompts x n choices
MAX_LOGIT_BIAS = 1024  # tokens one request may bias
MAX_BIAS = 100.0  # OpenAI's range: -100 bans a token, 100 all but forces it
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # signed 64-bit, as vLLM and the SQL and JSON clients take it


class StreamOptions(StrictModel):
    include_usage: bool = False


class TextPart(ReplayedModel):
    type: Literal["text"]
    text: str


class ChatMessage(ReplayedModel):
    """Unknown fields (a replayed reply's `refusal`, `annotations`, `reasoning_content`, ...) are ignored."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None  # role "tool": the call this message answers
    tool_calls: list[ToolCallBody] | None = None  # role "assistant": the calls it made

    @model_validator(mode="after")
    def _check_tool_fields(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a message with role 'tool' needs the tool_call_id it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class SpeculativeBody(StrictModel):
    """Per-request speculative decoding; only greedy or unseeded requests without penalties, logprobs, steering or
    monitoring speculate."""

    method: Literal["ngram", "none", "draft", "self"]
    num_tokens: int | None = Field(None, ge=1, le=MAX_SPECULATIVE_TOKENS)


class GenerationFields(StructuredFields, OpenAIExtras, DetokenizeFields):
    """Fields shared by chat and completions, OpenAI's and vLLM's extra sampling parameters (and vLLM's
    structured-output constraints)."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: Annotated[float, NULL_IS_DEFAULT] = Field(1.0, ge=0.0, le=2.0)
    top_p: Annotated[float, NULL_IS_DEFAULT] = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stream: Annotated[bool, NULL_IS_DEFAULT] = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, NULL_IS_DEFAULT] = Field(1, ge=1, le=MAX_CHOICES)
    presence_penalty: Annotated[float, NULL_IS_DEFAULT] = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: Annotated[float, NULL_IS_DEFAULT] = Field(0.0, ge=-2.0, le=2.0)
    user: str | None = None
    # vLLM's extra parameters
    ignore_eos: bool = False
    top_k: int = Field(0, ge=-1, description="0 or -1: off")
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    # steerbatch's own: SAE steering (features: [] is explicitly unsteered) and per-request monitoring
    steering: SteeringBody | None = None
    speculative: SpeculativeBody | None = None
    monitor: MonitorBody | None = None
    # OpenAI's token id (a string, as JSON keys are) -> bias; vLLM's prompt logprobs (this many alternatives)
    logit_bias: dict[str, float] | None = None
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # vLLM's: each streamed chunk carries its tokens' ids, and every event with tokens makes a chunk, text or not
    return_token_ids: bool = False

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, logit_bias: dict[str, float] | None) -> dict[str, float] | None:
        if logit_bias is not None and len(logit_bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens may be biased")
        for token, bias in (logit_bias or {}).items():
            if not -MAX_BIAS <= bias <= MAX_BIAS:
                raise ValueError(f"the bias of token {token} is {bias}; biases lie in [-100, 100]")
        return logit_bias

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stop

    @field_validator("stream_options")
    @classmethod
    def _check_stream_options(cls, options: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return options

    @field_validator("return_token_ids")
    @classmethod
    def _check_return_token_ids(cls, is_asked: bool, info: ValidationInfo) -> bool:
        if is_asked and not info.data.get("stream"):  # a stored result keeps its text, not its token ids
            raise ValueError("return_token_ids is only supported when stream is true")
        return is_asked

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """None: no logprobs; k: the sampled token's and the top k."""
        return None

    @property
    def echoes_prompt(self) -> bool:
        return False

    @property
    def num_prompt_logprobs(self) -> int | None:
        """The alternatives the engine scores at each prompt position; None: it scores none."""
        return self.prompt_logprobs


class ChatCompletionRequest(GenerationFields, ToolFields, ChatTemplateFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: Annotated[bool, NULL_IS_DEFAULT] = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_needs_logprobs(cls, top_logprobs: int | None, info: ValidationInfo) -> int | None:
        if top_logprobs is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs to be true")
        return top_logprobs

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(GenerationFields):
    """One prompt (a string or token ids) or a list of them; max_tokens 0 with echo scores the prompts only."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(None, ge=0)
    echo: Annotated[bool, NULL_IS_DEFAULT] = False
    add_special_tokens: bool = True  # vLLM's: a text prompt gets the tokenizer's special tokens (its BOS)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _check_prompts(cls, prompt: str | list) -> str | list:
        prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else [prompt]
        if len(prompts) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts are allowed in one request")
        if any(not one for one in prompts):
            raise ValueError("prompt must not be empty")
        return prompt

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix: str | None) -> str | None:
        if suffix is not None:
            raise ValueError("suffix is not supported: the served models complete text only forward")
        return suffix

    @model_validator(mode="after")
    def _check_num_choices(self) -> CompletionRequest:
        if len(self.prompts) * self.n > MAX_PROMPTS:
            raise ValueError(f"prompts x n must be at most {MAX_PROMPTS}")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        prompt = self.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], (str, list)):
            return list(prompt)
        return [prompt]  # type: ignore[list-item]

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def echoes_prompt(self) -> bool:
        return self.echo

    @property
    def num_prompt_logprobs(self) -> int | None:
        """As vLLM: an echo with logprobs scores the prompt too; enough alternatives for both that ask."""
        asked = [k for k in (self.prompt_logprobs, self.logprobs if self.echo else None) if k is not None]
        return max(asked) if asked else None
