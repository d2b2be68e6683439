"""What the engine is handed to embed, and what it answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from tasks.messages.steering import SteeringSpec
from worker.steering.request_sae import RequestSAE


@dataclass(frozen=True)
class EmbeddingRequest:
    request_id: str
    inputs: list[list[int]]  # token ids, each input whole: none is longer than the model's context
    dimensions: int | None = None  # keep this many leading components (then normalise); None: all
    steering: SteeringSpec | None = None

    def to_dict(self) -> dict[str, Any]:
        steering = None if self.steering is None else self.steering.to_dict()
        return {
            "request_id": self.request_id,
            "inputs": self.inputs,
            "dimensions": self.dimensions,
            "steering": steering,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmbeddingRequest:
        steering = None if data["steering"] is None else SteeringSpec.from_dict(data["steering"])
        return cls(data["request_id"], data["inputs"], data["dimensions"], steering)


@dataclass(frozen=True)
class EmbeddingResult:
    request_id: str
    vectors: torch.Tensor | None  # [B, dimensions] float32 on the CPU, each row of L2 norm 1; None on an error
    error: str | None = None
    error_param: str | None = None  # the request field at fault (its steering, or a model that cannot embed)

    def to_dict(self) -> dict[str, Any]:
        vectors = None if self.vectors is None else self.vectors.tolist()
        return {"request_id": self.request_id, "vectors": vectors, "error": self.error, "error_param": self.error_param}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmbeddingResult:
        vectors = None if data["vectors"] is None else torch.tensor(data["vectors"], dtype=torch.float32)
        return cls(data["request_id"], vectors, data["error"], data["error_param"])


EmbeddingCallback = Callable[[EmbeddingResult], None]


@dataclass(frozen=True)
class EmbeddingJob:
    """A request with its steering resolved (on the submitting thread), waiting for the engine thread."""

    request: EmbeddingRequest
    sae: RequestSAE | None
    on_done: EmbeddingCallback

    def fail(self, error: str, param: str | None = None) -> None:
        self.on_done(EmbeddingResult(self.request.request_id, None, error, param))
