"""A chat request's choices as the output processor follows them, and the stream events a pass's engine outputs make
of them."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerFast

from tasks.messages.generation import ErrorInfo, EventType, GenerateRequest, StreamEvent
from worker.engine.interface import Engine, EngineOutput
from worker.text.choice import Choice, ChoiceDelta
from worker.text.steering_report import SteeringReport


@dataclass(eq=False)
class FollowedRequest:
    """A chat request's choices as the processor follows them. `done` is set once its events are in Redis and
    every choice has ended, or a choice failed (`error`), or its events could not be written (`failure`)."""

    request: GenerateRequest
    report: SteeringReport  # the steering that ran and the positions monitored, gathered from choice 0's outputs
    choices: dict[str, Choice] = field(default_factory=dict)  # by engine request id, in index order
    error: ErrorInfo | None = None
    failure: Exception | None = None
    done: threading.Event = field(default_factory=threading.Event)
    pending: list[EngineOutput] = field(default_factory=list)  # arrived, not yet applied (the processor's lock)
    is_followed: bool = False  # the processor's lock: its outputs are applied from now on
    is_forgotten: bool = False  # the processor's lock: its outputs are dropped from now on
    is_in_pass: bool = False  # the processor's lock: a pass has taken outputs of it and not yet written their events
    opening: StreamEvent | None = None  # set by `follow`: written before its outputs' events, by the next pass
    # the processor's lock: a pass has taken outputs of it, so its next output is not its first token
    has_outputs_taken: bool = False
    last_token_at: float | None = None  # the processor's thread: unix seconds of the last pass that wrote its tokens
    # the processor's thread: when its stream's expiry was last set, or before (its START event sets it later)
    expiry_set_at: float = field(default_factory=time.monotonic)

    def apply(
        self, outputs: list[EngineOutput], tokenizer: PreTrainedTokenizerFast, engine: Engine
    ) -> list[StreamEvent]:
        """The stream events `outputs` make, a choice's outputs in one event (one entry, one SSE frame for the client,
        whatever number of engine steps they span); cancels a choice in the engine that a stop string ended first."""
        deltas: list[tuple[int, ChoiceDelta]] = []
        open_delta_at: dict[int, int] = {}  # by choice index: where in `deltas` its outputs are being joined
        for output in self._joined(outputs):
            choice = self.choices[output.request_id]
            if choice.is_done:
                continue  # the abort that follows a stop string
            self.report.add(output)
            delta = choice.apply(output, tokenizer)
            if choice.error is not None:
                self.error = ErrorInfo(choice.error, choice.error_type, choice.error_param)
                break
            at = open_delta_at.get(choice.index)
            # a tool call's entries close the event: text after them is not moved before them
            if at is not None and not deltas[at][1].tool_calls:
                deltas[at] = (choice.index, deltas[at][1].followed_by(delta))
            else:
                open_delta_at[choice.index] = len(deltas)
                deltas.append((choice.index, delta))
            if choice.is_done and output.finish_reason is None:
                engine.cancel(choice.engine_request_id)
        return [event for index, delta in deltas if (event := _delta_event(index, delta)) is not None]

    def _joined(self, outputs: list[EngineOutput]) -> list[EngineOutput]:
        """`outputs` with each run of a choice's token-only outputs as one: a pass takes a stream's outputs of
        several engine steps (one a step), and a choice detokenizes and checks each output's tokens with the same
        Python around them whatever their number. A run is joined once it ends, into one new output (joining each
        output into the one before built a new output per output: the pass's largest cost in a profile at 32
        streams)."""
        joined: list[EngineOutput] = []
        run: list[EngineOutput] = []  # one choice's token-only outputs, the last of them not yet its final one
        for output in outputs:
            if run and (
                output.request_id != run[-1].request_id
                or run[-1].finish_reason is not None
                or not _carries_only_tokens(output)
            ):
                joined.append(_join(run))
                run = []
            if run or (_carries_only_tokens(output) and self.choices[output.request_id].takes_joined_outputs):
                run.append(output)
            else:
                joined.append(output)
        if run:
            joined.append(_join(run))
        return joined

    @property
    def has_ended(self) -> bool:
        return self.error is not None or all(choice.is_done for choice in self.choices.values())


def _join(run: list[EngineOutput]) -> EngineOutput:
    """One output for a run of a choice's token-only outputs: their tokens, the last one's finish reason and the
    cumulative counts as of the run's end."""
    if len(run) == 1:
        return run[0]
    return EngineOutput(
        run[0].request_id,
        [token_id for output in run for token_id in output.new_token_ids],
        run[-1].finish_reason,
        num_cached_tokens=max(output.num_cached_tokens for output in run),
        num_proposed_tokens=max(output.num_proposed_tokens for output in run),
        num_accepted_tokens=max(output.num_accepted_tokens for output in run),
    )


def _carries_only_tokens(output: EngineOutput) -> bool:
    """Tokens, a finish reason and the cumulative counts: nothing applied per output (logprobs, an error, steering,
    monitored positions, prompt scores)."""
    return (
        output.error is None
        and not output.logprobs
        and output.steering is None
        and not output.monitor
        and not output.prompt_logprobs
    )


def _delta_event(index: int, delta: ChoiceDelta) -> StreamEvent | None:
    """Choice 0's finish reason rides on the FINAL event; the others end with their last DELTA."""
    finish_reason = delta.finish_reason if index > 0 else None
    if not (delta.text or delta.token_ids or delta.tool_calls or delta.prompt_logprobs or finish_reason is not None):
        return None
    return StreamEvent(
        EventType.DELTA,
        text=delta.text,
        token_ids=delta.token_ids,
        logprobs=delta.logprobs,
        index=index,
        finish_reason=finish_reason,
        tool_calls=delta.tool_calls,
        text_offset=delta.text_offset,
        prompt_logprobs=delta.prompt_logprobs,
    )
