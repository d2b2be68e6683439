"""JSON-safe dataclasses that cross process boundaries (Celery task arguments, Redis stream entries)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from tasks.messages.grammar import GrammarSpec
from tasks.messages.steering import MonitorSpec, SteeringSpec
from tasks.store.tenants import DEFAULT_TENANT

if TYPE_CHECKING:
    from tasks.messages.stream_chunks import StreamMeta


class Endpoint(str, Enum):
    CHAT = "chat.completions"
    COMPLETIONS = "completions"


class FinishReason(str, Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # cancelled: client disconnect or explicit cancel
    TOOL_CALLS = "tool_calls"  # the reply made tool calls (it ended by a stop or its length, as vLLM reports)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # vLLM's extra parameter: generate max_tokens whatever the model says
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # drop tokens below min_p x the top token's probability
    repetition_penalty: float = 1.0  # vLLM's: divides positive logits (multiplies negative) of seen tokens
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from each token already generated
    frequency_penalty: float = 0.0  # OpenAI's: subtracted per occurrence in the generated text
    min_tokens: int = 0  # EOS and stop token ids are masked until this many tokens exist
    logprobs: int | None = None  # None: none; k: the sampled token's logprob and the k most likely
    speculative_method: str | None = None  # "ngram", "draft", "self" or "none"; None: the worker's default
    num_speculative_tokens: int | None = None  # most tokens proposed per step; None: the worker's default
    skip_special_tokens: bool = True  # vLLM's: special tokens produce no text
    include_stop_str_in_output: bool = False  # vLLM's: the stop string, or the stop token's text, ends the text
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added to the row's logits before it picks
    prompt_logprobs: int | None = None  # None: none; k: each prompt token's logprob, rank and the k most likely

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def to_dict(self) -> dict[str, Any]:
        # field by field, not `dataclasses.asdict`, whose deep copy was a tenth of the api's CPU for a request
        return {
            **{field.name: getattr(self, field.name) for field in dataclasses.fields(self)},
            "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids),
            "logit_bias": [list(pair) for pair in self.logit_bias],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        tuples = {
            "stop": tuple(data.get("stop", ())),
            "stop_token_ids": tuple(data.get("stop_token_ids", ())),
            "logit_bias": tuple((int(token_id), float(bias)) for token_id, bias in data.get("logit_bias", ())),
        }
        return cls(**{**data, **tuples})


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the model, and the `top` most likely (token_id, logprob) pairs; a prompt
    token's also has its `rank` (1: the most likely)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None

    def to_dict(self) -> dict[str, Any]:
        top = [list(pair) for pair in self.top]
        return {"token_id": self.token_id, "logprob": self.logprob, "top": top, "rank": self.rank}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenLogprob:
        top = tuple((int(token_id), float(logprob)) for token_id, logprob in data.get("top", ()))
        return cls(int(data["token_id"]), float(data["logprob"]), top, data.get("rank"))


@dataclass(frozen=True)
class ChoiceResult:
    """One of a request's completions (prompt_index * n + j); `logprobs` holds chat's content entries when they were
    asked for, `prompt_logprobs` vLLM's (None first, then token id -> logprob, rank, decoded_token)."""

    index: int
    text: str
    finish_reason: FinishReason | None
    logprobs: list[dict[str, Any]] | None = None
    prompt_logprobs: list[dict[str, Any] | None] | None = None

    def to_dict(self) -> dict[str, Any]:
        reason = self.finish_reason.value if self.finish_reason else None
        return {
            "index": self.index,
            "text": self.text,
            "finish_reason": reason,
            "logprobs": self.logprobs,
            "prompt_logprobs": self.prompt_logprobs,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChoiceResult:
        reason = FinishReason(data["finish_reason"]) if data.get("finish_reason") else None
        return cls(int(data["index"]), data["text"], reason, data.get("logprobs"), data.get("prompt_logprobs"))


@dataclass(frozen=True)
class GenerateRequest:
    """What the api hands the worker: tokenized prompts (the first, then any more) and how to sample each, `n`
    times; choice prompt_index * n + j is prompt_index's j-th."""

    request_id: str
    endpoint: Endpoint
    model: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    created: int
    n: int = 1
    steering: SteeringSpec | None = None  # None: the request said nothing, so its tenant's or the worker's profile
    monitor: MonitorSpec | None = None
    tenant: str = DEFAULT_TENANT  # whose request it is: picks the tenant's steering profile in the worker
    grammar: GrammarSpec | None = None  # structured output or forced tool calls: every token obeys it
    tool_parser: str | None = None  # the reply's tool calls are parsed in this format (tools offered, not "none")
    more_prompt_token_ids: list[list[int]] = field(default_factory=list)  # a completion's prompts after the first
    echo: bool = False  # each choice's text and logprobs start with its prompt's
    echo_from: int = 0  # the echo leaves out this many leading tokens: those the tokenizer added to a text prompt
    prompt_logprobs: int | None = None  # vLLM's: each choice's `prompt_logprobs`, with this many alternatives
    arrival_time: float = 0.0  # unix seconds, to the microsecond, when the api took it: where latencies start
    is_legacy_functions: bool = False  # it offered legacy `functions`: a call is answered as `function_call`
    stream_meta: StreamMeta | None = None  # a streamed chat or completion: its DELTAs carry the client's chunks too

    @property
    def prompts(self) -> list[list[int]]:
        return [self.prompt_token_ids, *self.more_prompt_token_ids]

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def num_prompt_tokens(self) -> int:
        """Over every prompt, as usage counts them."""
        return sum(len(prompt) for prompt in self.prompts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "endpoint": self.endpoint.value,
            "model": self.model,
            "prompt_token_ids": list(self.prompt_token_ids),
            "sampling": self.sampling.to_dict(),
            "created": self.created,
            "n": self.n,
            "steering": None if self.steering is None else self.steering.to_dict(),
            "monitor": None if self.monitor is None else self.monitor.to_dict(),
            "tenant": self.tenant,
            "grammar": None if self.grammar is None else self.grammar.to_dict(),
            "tool_parser": self.tool_parser,
            "more_prompt_token_ids": [list(prompt) for prompt in self.more_prompt_token_ids],
            "echo": self.echo,
            "echo_from": self.echo_from,
            "prompt_logprobs": self.prompt_logprobs,
            "arrival_time": self.arrival_time,
            "is_legacy_functions": self.is_legacy_functions,
            "stream_meta": None if self.stream_meta is None else self.stream_meta.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerateRequest:
        return cls(
            request_id=data["request_id"],
            endpoint=Endpoint(data["endpoint"]),
            model=data["model"],
            prompt_token_ids=list(data["prompt_token_ids"]),
            sampling=SamplingParams.from_dict(data["sampling"]),
            created=int(data["created"]),
            n=int(data.get("n", 1)),
            steering=None if data.get("steering") is None else SteeringSpec.from_dict(data["steering"]),
            monitor=None if data.get("monitor") is None else MonitorSpec.from_dict(data["monitor"]),
            tenant=data.get("tenant", DEFAULT_TENANT),  # messages and ledger rows from before tenancy
            grammar=None if data.get("grammar") is None else GrammarSpec.from_dict(data["grammar"]),
            tool_parser=data.get("tool_parser"),
            more_prompt_token_ids=[list(prompt) for prompt in data.get("more_prompt_token_ids", ())],
            echo=bool(data.get("echo", False)),
            echo_from=int(data.get("echo_from", 0)),
            prompt_logprobs=data.get("prompt_logprobs"),
            arrival_time=float(data.get("arrival_time", data["created"])),  # messages from before it was sent
            is_legacy_functions=bool(data.get("is_legacy_functions", False)),
            stream_meta=_stream_meta(data.get("stream_meta")),
        )


def _stream_meta(data: dict[str, Any] | None) -> StreamMeta | None:
    from tasks.messages.stream_chunks import StreamMeta  # it builds chunks of this module's events: imported late

    return None if data is None else StreamMeta.from_dict(data)


@dataclass(frozen=True)
class UsageDetails:
    """What OpenAI's usage details report: prompt tokens the prefix cache served, and proposed (predicted) tokens
    speculative decoding accepted or rejected."""

    cached_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> UsageDetails:
        return cls(**{key: int(value) for key, value in (data or {}).items()})


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    details: UsageDetails = field(default_factory=UsageDetails)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": {"cached_tokens": self.details.cached_tokens},
            "completion_tokens_details": {
                "accepted_prediction_tokens": self.details.accepted_prediction_tokens,
                "rejected_prediction_tokens": self.details.rejected_prediction_tokens,
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Usage:
        details = UsageDetails(
            cached_tokens=int((data.get("prompt_tokens_details") or {}).get("cached_tokens", 0)),
            **{
                key: int(value)
                for key, value in (data.get("completion_tokens_details") or {}).items()
                if key in ("accepted_prediction_tokens", "rejected_prediction_tokens")
            },
        )
        return cls(int(data["prompt_tokens"]), int(data["completion_tokens"]), details)


# OpenAI's error type -> the HTTP status of a response carrying it (a non-streamed reply, a batch line's response)
ERROR_STATUS = {"invalid_request_error": 400, "service_unavailable": 503}


def error_status_code(error_type: str | None) -> int:
    return ERROR_STATUS.get(error_type or "", 500)


@dataclass(frozen=True)
class ErrorInfo:
    """An error in OpenAI's shape, as stored and streamed."""

    message: str
    type: str = "server_error"
    param: str | None = None
    code: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ErrorInfo:
        return cls(**data)


class EventType(str, Enum):
    START = "start"  # the worker took the request
    DELTA = "delta"  # new text
    FINAL = "final"  # finish_reason and usage, or an error


@dataclass(frozen=True)
class StreamEvent:
    """One entry of a request's Redis stream."""

    type: EventType
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: ErrorInfo | None = None
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # DELTA: chat's logprobs.content entries
    index: int = 0  # DELTA: the choice; with n > 1 a DELTA ends choices 1.. with finish_reason, FINAL ends choice 0
    steering: dict[str, Any] | None = None  # FINAL: the steering that ran (steerbatch's report)
    monitor: dict[str, Any] | None = None  # FINAL: the monitored positions
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # DELTA: OpenAI's delta.tool_calls entries
    text_offset: int = 0  # DELTA: where the first logprobs entry's token starts in the choice's text
    prompt_logprobs: list[dict[str, Any] | None] | None = None  # DELTA: the choice's vLLM prompt_logprobs, once

    def to_dict(self) -> dict[str, Any]:
        """Only the fields that differ from their defaults (`from_dict` restores the rest): a token's DELTA is every
        request's most frequent message, and each byte of it is encoded by the worker and decoded by the api."""
        full = {
            "type": self.type.value,
            "text": self.text,
            "token_ids": list(self.token_ids),
            "logprobs": list(self.logprobs),
            "index": self.index,
            "finish_reason": self.finish_reason.value if self.finish_reason else None,
            "usage": self.usage.to_dict() if self.usage else None,
            "error": self.error.to_dict() if self.error else None,
            "steering": self.steering,
            "monitor": self.monitor,
            "tool_calls": list(self.tool_calls),
            "text_offset": self.text_offset,
            "prompt_logprobs": self.prompt_logprobs,
        }
        return {name: value for name, value in full.items() if name == "type" or value != _EVENT_DEFAULTS[name]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StreamEvent:
        return cls(
            type=EventType(data["type"]),
            text=data.get("text", ""),
            token_ids=list(data.get("token_ids", [])),
            finish_reason=FinishReason(data["finish_reason"]) if data.get("finish_reason") else None,
            usage=Usage.from_dict(data["usage"]) if data.get("usage") else None,
            error=ErrorInfo.from_dict(data["error"]) if data.get("error") else None,
            logprobs=list(data.get("logprobs", [])),
            index=int(data.get("index", 0)),
            steering=data.get("steering"),
            monitor=data.get("monitor"),
            tool_calls=list(data.get("tool_calls", [])),
            text_offset=int(data.get("text_offset", 0)),
            prompt_logprobs=data.get("prompt_logprobs"),
        )


# Each field's default, which is also its serialized form (None, "", 0, []): an entry omits it
_EVENT_DEFAULTS: dict[str, Any] = {
    f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
    for f in dataclasses.fields(StreamEvent)
    if f.name != "type"
}
