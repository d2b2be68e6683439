"""One of a request's `n` completions, as the task handler follows its engine outputs."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerFast

from tasks.messages.generation import ChoiceResult, FinishReason, GenerateRequest
from tasks.messages.grammar import ToolCallGrammar
from tasks.messages.steering import SteeringSpec
from tasks.messages.tool_calls import ToolCallStream
from worker.engine.interface import INTERACTIVE_PRIORITY, Engine, EngineOutput, EngineRequest, OutputCallback
from worker.text.detokenizer import visible_text
from worker.text.logprob_entries import echo_entries, logprob_entries, vllm_prompt_logprobs
from worker.text.text_stream import TextStream

logger = logging.getLogger(__name__)
ENGINE_FAILURE = "The engine failed while running this request."


@dataclass(frozen=True)
class ChoiceDelta:
    """What one engine output adds to a choice for the client; `finish_reason` once the choice has ended."""

    text: str
    token_ids: list[int]
    logprobs: list[dict[str, Any]]
    finish_reason: FinishReason | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's delta.tool_calls entries
    text_offset: int = 0  # where the first of `logprobs` starts in the choice's text
    prompt_logprobs: list[dict[str, Any] | None] | None = None  # vLLM's, on the choice's first delta

    def followed_by(self, later: ChoiceDelta) -> ChoiceDelta:
        """This delta and the next of the same choice as one: what a client reads from both, in order."""
        return ChoiceDelta(
            self.text + later.text,
            self.token_ids + later.token_ids,
            self.logprobs + later.logprobs,
            later.finish_reason,
            self.tool_calls + later.tool_calls,
            self.text_offset,
            self.prompt_logprobs if self.prompt_logprobs is not None else later.prompt_logprobs,
        )


@dataclass(frozen=True)
class PromptShow:
    """What a choice shows of its prompt: echoed text and entries, and vLLM's prompt_logprobs."""

    token_ids: list[int]
    is_echoed: bool = False
    num_echo_top: int = 0  # alternatives per echoed entry: the request's logprobs
    num_vllm_top: int | None = None  # vLLM's prompt_logprobs; None: not asked for
    echo_from: int = 0  # the echo leaves out the tokens the tokenizer added before a text prompt


@dataclass
class Choice:
    index: int
    engine_request_id: str
    text_stream: TextStream
    wants_logprobs: bool
    tool_calls: ToolCallStream | None = None  # the request offered tools: its text is read for calls
    calls_finish_reason: FinishReason = FinishReason.TOOL_CALLS  # STOP for a call to a function tool_choice named
    prompt: PromptShow | None = None  # None: the choice shows nothing of its prompt
    echo_text: str = ""
    prompt_logprobs: list[dict[str, Any] | None] | None = None
    text_offset: int = 0  # characters of the tokens of every logprobs entry so far (legacy text_offset)
    num_tokens: int = 0
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    error: str | None = None
    error_type: str = "server_error"  # OpenAI's error type: invalid_request_error when the engine refused the request
    error_param: str | None = None  # the request field the engine's refusal names
    num_cached_tokens: int = 0
    num_proposed_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def is_done(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    @property
    def takes_joined_outputs(self) -> bool:
        """Whether outputs that carry only tokens may be applied as one: the same text, token ids and counts as one
        at a time. Not with stop strings (tokens after the one that completes a stop string are not the choice's),
        tool calls (text after a call stays after it) or a prompt still to show (it comes with the first output)."""
        return self.tool_calls is None and self.prompt is None and not self.text_stream.has_stop_strings

    def apply(self, output: EngineOutput, tokenizer: PreTrainedTokenizerFast) -> ChoiceDelta:
        if output.error is not None:
            self.error_param = output.error_param
            if output.is_request_error:  # the engine refused the request: its message says what to fix
                self.error, self.error_type = output.error, "invalid_request_error"
            else:  # the engine's own failure may name files and internals: the log gets it, the client a summary
                logger.error("engine request %s failed: %s", self.engine_request_id, output.error)
                self.error, self.error_type = ENGINE_FAILURE, "server_error"
            return ChoiceDelta("", [], [], None)
        self.num_tokens += len(output.new_token_ids)
        # cumulative counts; an abort's output carries none of them
        self.num_cached_tokens = max(self.num_cached_tokens, output.num_cached_tokens)
        self.num_proposed_tokens = max(self.num_proposed_tokens, output.num_proposed_tokens)
        self.num_accepted_tokens = max(self.num_accepted_tokens, output.num_accepted_tokens)
        # a token's output with neither logprobs nor a prompt to show (almost every one) skips their bookkeeping
        entries = logprob_entries(tokenizer, output.logprobs) if output.logprobs else []
        text, prompt_logprobs = "", None
        if self.prompt is not None:  # the first output: the prompt's scores come with it
            text, prompt_entries, prompt_logprobs = self._show_prompt(self.prompt, output, tokenizer)
            entries = prompt_entries + entries
        text_offset = self.text_offset
        if entries:
            self.text_offset += sum(len(entry["token"]) for entry in entries)
            self.logprobs.extend(entries)
        text += self.text_stream.push(output.new_token_ids, output.finish_reason == FinishReason.STOP)
        if self.text_stream.is_stopped:
            self.finish_reason = FinishReason.STOP
        elif output.finish_reason is not None:
            text += self.text_stream.flush()
            self.finish_reason = output.finish_reason
        if self.tool_calls is None:
            return ChoiceDelta(
                text, output.new_token_ids, entries, self.finish_reason, [], text_offset, prompt_logprobs
            )
        delta = self._tool_call_delta(text, output.new_token_ids, entries)
        return dataclasses.replace(delta, text_offset=text_offset, prompt_logprobs=prompt_logprobs)

    def _show_prompt(
        self, prompt: PromptShow, output: EngineOutput, tokenizer: PreTrainedTokenizerFast
    ) -> tuple[str, list[dict[str, Any]], list[dict[str, Any] | None] | None]:
        """The echoed text and entries, and vLLM's prompt_logprobs, which the result keeps too."""
        self.prompt = None
        if prompt.num_vllm_top is not None:
            self.prompt_logprobs = vllm_prompt_logprobs(tokenizer, output.prompt_logprobs, prompt.num_vllm_top)
        if not prompt.is_echoed:
            return "", [], self.prompt_logprobs
        # decoded with its special tokens, less those the tokenizer added to a text prompt (which the client never sent)
        self.echo_text = visible_text(tokenizer.decode(prompt.token_ids[prompt.echo_from :]))
        entries = echo_entries(tokenizer, prompt.token_ids, output.prompt_logprobs, prompt.num_echo_top)
        entries = entries[prompt.echo_from :]
        return self.echo_text, entries if self.wants_logprobs else [], self.prompt_logprobs

    def _tool_call_delta(self, text: str, token_ids: list[int], entries: list[dict[str, Any]]) -> ChoiceDelta:
        """The new text split into content and whole calls; a reply that made calls finishes with "tool_calls", or
        "length" when max_tokens cut it (a call it cut is sent as far as it got)."""
        stream = self.tool_calls
        assert stream is not None
        content, calls = stream.feed(text)
        if self.finish_reason is not None:
            tail, tail_calls = stream.flush(is_cut=self.finish_reason == FinishReason.LENGTH)
            content, calls = content + tail, calls + tail_calls
            if stream.calls and self.finish_reason not in (FinishReason.ABORT, FinishReason.LENGTH):
                self.finish_reason = self.calls_finish_reason
        first = len(stream.calls) - len(calls)
        deltas = [entry for offset, call in enumerate(calls) for entry in call.delta_entries(first + offset)]
        return ChoiceDelta(content, token_ids, entries, self.finish_reason, deltas)

    def result(self) -> ChoiceResult:
        return ChoiceResult(
            self.index,
            self.echo_text + self.text_stream.text,
            self.finish_reason,
            self.logprobs if self.wants_logprobs else None,
            self.prompt_logprobs,
        )


def engine_request_id(request: GenerateRequest, index: int) -> str:
    """Choice `index` of the request in the engine: the request's own id when it has one choice."""
    return request.request_id if request.num_choices == 1 else f"{request.request_id}#{index}"


def start_choice(
    engine: Engine,
    tokenizer: PreTrainedTokenizerFast,
    request: GenerateRequest,
    index: int,
    on_output: OutputCallback,
    steering: SteeringSpec | None,
    priority: int = INTERACTIVE_PRIORITY,
) -> Choice:
    """Choice prompt_index * n + j runs as its own engine request, of that prompt; a seeded request's j-th choice of
    a prompt uses seed + j. Every choice is steered alike; only choice 0 is monitored, since the prompt's positions
    would repeat n times."""
    choice_id = engine_request_id(request, index)
    prompt_ids = request.prompts[index // request.n]
    sampling = request.sampling
    if sampling.seed is not None and index % request.n > 0:
        sampling = dataclasses.replace(sampling, seed=sampling.seed + index % request.n)
    monitor = request.monitor if index == 0 else None
    engine_request = EngineRequest(
        choice_id,
        prompt_ids,
        sampling,
        priority,
        steering=steering,
        monitor=monitor,
        grammar=request.grammar,
    )
    text_stream = TextStream(tokenizer, prompt_ids, sampling)
    parser = request.tool_parser
    tool_calls = None if parser is None else ToolCallStream(parser, f"{request.request_id}:{index}")
    prompt = None
    if request.echo or request.prompt_logprobs is not None:
        prompt = PromptShow(
            prompt_ids, request.echo, sampling.logprobs or 0, request.prompt_logprobs, request.echo_from
        )
    wants_logprobs = sampling.logprobs is not None
    calls_finish = FinishReason.STOP if ToolCallGrammar.is_named_in(request.grammar) else FinishReason.TOOL_CALLS
    choice = Choice(index, choice_id, text_stream, wants_logprobs, tool_calls, calls_finish, prompt=prompt)
    engine.submit(engine_request, on_output)
    return choice
