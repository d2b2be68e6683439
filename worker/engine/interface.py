"""The generation interface every engine implements: submit token ids, receive token events, cancel by id."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tasks.messages.generation import FinishReason, SamplingParams, TokenLogprob
from tasks.messages.grammar import GrammarSpec
from tasks.messages.steering import MonitoredPosition, MonitorSpec, SteeringSpec

INTERACTIVE_PRIORITY = 0
BULK_PRIORITY = 1


class RequestFieldError(Exception):
    """The request cannot run as it asks (a grammar that does not compile, a steering vector file that does not
    exist): the client's to fix; `param` names the request field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    priority: int = INTERACTIVE_PRIORITY  # lower runs first; bulk lines yield to chat
    steering: SteeringSpec | None = None  # None: unsteered; a spec with nothing in it: explicitly unsteered
    monitor: MonitorSpec | None = None
    grammar: GrammarSpec | None = None  # every token obeys it

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "prompt_token_ids": self.prompt_token_ids,
            "sampling": self.sampling.to_dict(),
            "priority": self.priority,
            "steering": None if self.steering is None else self.steering.to_dict(),
            "monitor": None if self.monitor is None else self.monitor.to_dict(),
            "grammar": None if self.grammar is None else self.grammar.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineRequest:
        return cls(
            data["request_id"],
            data["prompt_token_ids"],
            SamplingParams.from_dict(data["sampling"]),
            data["priority"],
            None if data["steering"] is None else SteeringSpec.from_dict(data["steering"]),
            None if data["monitor"] is None else MonitorSpec.from_dict(data["monitor"]),
            None if data["grammar"] is None else GrammarSpec.from_dict(data["grammar"]),
        )


@dataclass(frozen=True)
class EngineOutput:
    """New tokens for one request after one engine step; `finish_reason` is set on its last output."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    error: str | None = None
    is_request_error: bool = False  # the request itself was refused (at admission, or its grammar dead-ended)
    error_param: str | None = None  # the request field at fault, for a refusal
    logprobs: tuple[TokenLogprob, ...] = ()  # one per new token, when the request asked for logprobs
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served (OpenAI's usage.prompt_tokens_details)
    num_proposed_tokens: int = 0  # so far for this request, by speculative decoding
    num_accepted_tokens: int = 0
    steering: SteeringSpec | None = None  # the steering as applied (strengths clamped), on a request's first output
    monitor: tuple[MonitoredPosition, ...] = ()  # positions the model read since the request's previous output
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()  # prompt tokens scored since the previous output (None first)

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    def to_dict(self) -> dict[str, Any]:
        """Only the fields a step set: most outputs are a request id and a token."""
        data: dict[str, Any] = {"request_id": self.request_id, "new_token_ids": self.new_token_ids}
        if self.finish_reason is not None:
            data["finish_reason"] = self.finish_reason.value
        if self.error is not None:
            data.update(error=self.error, is_request_error=self.is_request_error, error_param=self.error_param)
        if self.logprobs:
            data["logprobs"] = [logprob.to_dict() for logprob in self.logprobs]
        if self.num_cached_tokens or self.num_proposed_tokens or self.num_accepted_tokens:
            data.update(
                num_cached_tokens=self.num_cached_tokens,
                num_proposed_tokens=self.num_proposed_tokens,
                num_accepted_tokens=self.num_accepted_tokens,
            )
        if self.steering is not None:
            data["steering"] = self.steering.to_dict()
        if self.monitor:
            data["monitor"] = [position.to_dict() for position in self.monitor]
        if self.prompt_logprobs:
            data["prompt_logprobs"] = [None if lp is None else lp.to_dict() for lp in self.prompt_logprobs]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineOutput:
        if len(data) == 2:  # a request id and its tokens (`to_dict` leaves out what a step did not set): most outputs
            return cls(data["request_id"], data["new_token_ids"])
        finish_reason = data.get("finish_reason")
        steering = data.get("steering")
        return cls(
            data["request_id"],
            data["new_token_ids"],
            None if finish_reason is None else FinishReason(finish_reason),
            data.get("error"),
            data.get("is_request_error", False),
            data.get("error_param"),
            tuple(TokenLogprob.from_dict(logprob) for logprob in data.get("logprobs", ())),
            data.get("num_cached_tokens", 0),
            data.get("num_proposed_tokens", 0),
            data.get("num_accepted_tokens", 0),
            None if steering is None else SteeringSpec.from_dict(steering),
            tuple(MonitoredPosition.from_dict(position) for position in data.get("monitor", ())),
            tuple(None if lp is None else TokenLogprob.from_dict(lp) for lp in data.get("prompt_logprobs", ())),
        )


OutputCallback = Callable[[EngineOutput], None]


class Engine(Protocol):
    def submit(self, request: EngineRequest, on_output: OutputCallback) -> None:
        """Queue a request; `on_output` is called from the engine thread, last with a finished output."""

    def cancel(self, request_id: str) -> None:
        """Abort a request; its last output (finish_reason ABORT) follows within a step or two."""

    def is_alive(self) -> bool:
        """False once the engine thread has ended: nothing submitted will produce output."""
