"""What the engine is handed to embed, and what it answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tasks.messages.steering import SteeringSpec
from worker.steering.request_sae import RequestSAE


@dataclass(frozen=True)
class EmbeddingRequest:
    request_id: str
    inputs: list[list[int]]  # token ids, each input whole: none is longer than the model's context
    dimensions: int | None = None  # keep this many leading components (then normalise); None: all
    steering: SteeringSpec | None = None


@dataclass(frozen=True)
class EmbeddingResult:
    request_id: str
    vectors: torch.Tensor | None  # [B, dimensions] float32 on the CPU, each row of L2 norm 1; None on an error
    error: str | None = None
    error_param: str | None = None  # the request field at fault (its steering, or a model that cannot embed)


EmbeddingCallback = Callable[[EmbeddingResult], None]


@dataclass(frozen=True)
class EmbeddingJob:
    """A request with its steering resolved (on the submitting thread), waiting for the engine thread."""

    request: EmbeddingRequest
    sae: RequestSAE | None
    on_done: EmbeddingCallback

    def fail(self, error: str, param: str | None = None) -> None:
        self.on_done(EmbeddingResult(self.request.request_id, None, error, param))
