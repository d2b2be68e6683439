"""The engine thread's record of each request it holds, and of each submission waiting to be admitted."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from scheduler.request import Request
from tasks.steering_messages import MonitoredPosition
from worker.engine import EngineOutput, EngineRequest, OutputCallback
from worker.request_sae import RequestSAE


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

    def with_reports(self, output: EngineOutput) -> EngineOutput:
        """`output` carrying the applied steering (the first time) and the positions monitored since the last one."""
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
