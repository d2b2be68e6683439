"""The engine thread's record of each request it holds, and of each submission waiting to be admitted."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from scheduler.request import Request
from tasks.messages.generation import TokenLogprob
from tasks.messages.steering import MonitoredPosition
from worker.engine.grammar.compiler import GrammarError
from worker.engine.grammar.matcher import RowGrammar
from worker.engine.interface import EngineOutput, EngineRequest, OutputCallback, RequestFieldError
from worker.engine.sampling.sampler import SamplingRow
from worker.steering.request_sae import RequestSAE

if TYPE_CHECKING:  # xgrammar loads with the first grammar
    from xgrammar import CompiledGrammar


@dataclass
class EngineSequence:
    """The engine's side of one request: how to sample, steer and monitor it, and whom to tell."""

    request: EngineRequest
    on_output: OutputCallback
    generator: torch.Generator | None
    scheduled: Request
    sae: RequestSAE | None = None
    grammar: RowGrammar | None = None  # a constrained request's matcher, advanced by the tokens appended
    is_steering_reported: bool = False
    monitored: list[MonitoredPosition] = field(default_factory=list)  # read since the request's last output
    num_proposed_tokens: int = 0
    num_accepted_tokens: int = 0
    num_prompt_logprobs: int = 1  # prompt tokens scored so far: the first has no logprob (nothing precedes it)
    pending_prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # scored, not yet output
    _plain_row: SamplingRow = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.request.sampling.prompt_logprobs is not None:
            self.pending_prompt_logprobs.append(None)
        # Built once: it holds the scheduler's own token lists, which grow in place, and a step asks for every row.
        scheduled = self.scheduled
        self._plain_row = SamplingRow(
            self.request.sampling,
            self.generator,
            scheduled.prompt_token_ids,
            scheduled.output_token_ids,
            grammar=self.grammar,
        )

    def sampling_row(self) -> SamplingRow:
        """How to pick the request's next token: its stop tokens are suppressed until it has min_tokens outputs."""
        if self.scheduled.num_output_tokens >= self.request.sampling.min_tokens:
            return self._plain_row
        return dataclasses.replace(self._plain_row, suppressed_token_ids=tuple(sorted(self.scheduled.stop_token_ids)))

    def take_prompt_logprobs(self) -> tuple[TokenLogprob | None, ...]:
        taken, self.pending_prompt_logprobs = tuple(self.pending_prompt_logprobs), []
        return taken

    def with_reports(self, output: EngineOutput) -> EngineOutput:
        """`output` carrying the applied steering (the first time) and the positions monitored since the last one."""
        if not self.monitored and (self.sae is None or self.is_steering_reported):  # most outputs: nothing to add
            return output
        steering = None
        if self.sae is not None and not self.is_steering_reported:
            steering, self.is_steering_reported = self.sae.applied, True
        monitored, self.monitored = tuple(self.monitored), []
        if steering is None and not monitored:
            return output
        return dataclasses.replace(output, steering=steering, monitor=monitored)


def scheduled_request(request: EngineRequest, sae: RequestSAE | None, eos_token_ids: frozenset[int]) -> Request:
    """The scheduler's record of `request`: its stop tokens (EOS unless ignored), and a prefix-cache key that keeps
    differently steered requests from sharing blocks."""
    sampling = request.sampling
    stop_ids = set(sampling.stop_token_ids)
    if not sampling.ignore_eos:
        stop_ids |= eos_token_ids
    return Request(
        request_id=request.request_id,
        prompt_token_ids=list(request.prompt_token_ids),
        max_tokens=sampling.max_tokens,
        stop_token_ids=frozenset(stop_ids),
        min_tokens=sampling.min_tokens,
        priority=request.priority,
        steering_key="" if sae is None else sae.steering_key,
        # A cached block's positions are never computed: a monitor could not read them, and no logits would score
        # them. Prompt logprobs need every prompt position, so such a request takes no cached block (it still caches
        # its own blocks for others); vLLM skips the prefix cache for them too.
        may_reuse_cached_prefix=(sae is None or not sae.reads_prompt) and sampling.prompt_logprobs is None,
    )


def request_generator(request: EngineRequest, device: torch.device) -> torch.Generator | None:
    """A seeded request's own random stream, so its draws do not depend on what else is in the batch."""
    if request.sampling.seed is None:
        return None
    return torch.Generator(device=device).manual_seed(request.sampling.seed % 2**64)


@dataclass(frozen=True)
class Submission:
    request: EngineRequest
    on_output: OutputCallback
    sae: RequestSAE | None
    sae_error: RequestFieldError | None  # the request's steering or monitor could not be resolved
    grammar: CompiledGrammar | None = None  # the request's grammar, compiled on the submitting thread
    grammar_error: GrammarError | None = None  # it did not compile
