"""The generation interface every engine implements: submit token ids, receive token events, cancel by id."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

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


OutputCallback = Callable[[EngineOutput], None]


class Engine(Protocol):
    def submit(self, request: EngineRequest, on_output: OutputCallback) -> None:
        """Queue a request; `on_output` is called from the engine thread, last with a finished output."""

    def cancel(self, request_id: str) -> None:
        """Abort a request; its last output (finish_reason ABORT) follows within a step or two."""

    def is_alive(self) -> bool:
        """False once the engine thread has ended: nothing submitted will produce output."""
