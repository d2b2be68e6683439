"""The engine thread's record of each request it holds, and of each submission waiting to be admitted."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from scheduler.request import Request
from tasks.steering_messages import MonitoredPosition
from worker.engine.interface import EngineOutput, EngineRequest, OutputCallback
from worker.engine.sampler import SamplingRow
from worker.steering.request_sae import RequestSAE


@dataclass
class EngineSequence:
    """The engine's side of one request: how to sample, steer and monitor it, and whom to tell."""

    request: EngineRequest
    on_output: OutputCallback
    generator: torch.Generator | None
    scheduled: Request
    sae: RequestSAE | None = None
    is_steering_reported: bool = False
    monitored: list[MonitoredPosition] = field(default_factory=list)  # read since the request's last output
    num_proposed_tokens: int = 0
    num_accepted_tokens: int = 0
    _plain_row: SamplingRow = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Built once: it holds the scheduler's own token lists, which grow in place, and a step asks for every row.
        scheduled = self.scheduled
        self._plain_row = SamplingRow(
            self.request.sampling, self.generator, scheduled.prompt_token_ids, scheduled.output_token_ids
        )

    def sampling_row(self) -> SamplingRow:
        """How to pick the request's next token: its stop tokens are suppressed until it has min_tokens outputs."""
        if self.scheduled.num_output_tokens >= self.request.sampling.min_tokens:
            return self._plain_row
        return dataclasses.replace(self._plain_row, suppressed_token_ids=tuple(sorted(self.scheduled.stop_token_ids)))

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


@dataclass(frozen=True)
class Submission:
    request: EngineRequest
    on_output: OutputCallback
    sae: RequestSAE | None
    sae_error: str | None  # the request's steering or monitor could not be resolved
