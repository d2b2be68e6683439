"""The body of POST /v1/embeddings, as OpenAI's, with steerbatch's `steering`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from api.steering.schemas import SteeringBody
from api.structured.schemas import StrictModel

MAX_INPUTS = 2048  # OpenAI's bound on the inputs of one request
MAX_TOTAL_TOKENS = 300_000  # OpenAI's bound on their tokens, all inputs together

EmbeddingInput = str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(StrictModel):
    model: str
    input: EmbeddingInput = Field(
        description="a text, a list of texts, token ids, or a list of token-id lists; each no longer than the "
        "model's context"
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector's little-endian float32 bytes"
    )
    dimensions: int | None = Field(
        None, ge=1, description="keep the leading components, renormalised; at most the model's hidden size"
    )
    user: str | None = None
    steering: SteeringBody | None = None  # steerbatch's own: SAE features or raw vectors added as for chat

    @field_validator("input")
    @classmethod
    def _check_inputs(cls, value: EmbeddingInput) -> EmbeddingInput:
        inputs = value if isinstance(value, list) and value and isinstance(value[0], (str, list)) else [value]
        if len(inputs) > MAX_INPUTS:
            raise ValueError(f"at most {MAX_INPUTS} inputs are allowed in one request")
        if any(not one for one in inputs):
            raise ValueError("an input must not be empty")
        return value

    @property
    def is_list(self) -> bool:
        """A list of inputs (texts or token-id lists), rather than one text or one token-id list."""
        return isinstance(self.input, list) and isinstance(self.input[0], (str, list))

    @property
    def inputs(self) -> list[str | list[int]]:
        return list(self.input) if self.is_list else [self.input]  # type: ignore[list-item]
