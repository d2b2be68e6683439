"""An embeddings request as the api hands it to the worker, its vectors as the worker stores them (the little-endian
float32 bytes of every vector, one after another, in base64, which a result row's or batch line's text keeps
exactly), and OpenAI's embeddings response built from them, for the api and the Batch API's output lines."""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass
from typing import Any

from tasks.messages.steering import SteeringSpec
from tasks.store.tenants import DEFAULT_TENANT

EMBEDDINGS_ENDPOINT = "embeddings"  # the request row's endpoint
FLOAT32_BYTES = 4


@dataclass(frozen=True)
class EmbedRequest:
    request_id: str
    model: str
    inputs: list[list[int]]  # token ids of each input
    created: int
    dimensions: int | None = None  # the leading components each vector keeps (renormalised); None: all
    steering: SteeringSpec | None = None
    tenant: str = DEFAULT_TENANT
    encoding_format: str = "float"  # how the answer gives the vectors: "float" or "base64"

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.inputs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "endpoint": EMBEDDINGS_ENDPOINT,  # what a batch ledger's line holds: tells it from a GenerateRequest
            "request_id": self.request_id,
            "model": self.model,
            "inputs": [list(ids) for ids in self.inputs],
            "created": self.created,
            "dimensions": self.dimensions,
            "steering": None if self.steering is None else self.steering.to_dict(),
            "tenant": self.tenant,
            "encoding_format": self.encoding_format,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmbedRequest:
        return cls(
            request_id=data["request_id"],
            model=data["model"],
            inputs=[list(ids) for ids in data["inputs"]],
            created=int(data["created"]),
            dimensions=data.get("dimensions"),
            steering=None if data.get("steering") is None else SteeringSpec.from_dict(data["steering"]),
            tenant=data.get("tenant", DEFAULT_TENANT),
            encoding_format=data.get("encoding_format", "float"),
        )


def is_embed_request(data: dict[str, Any]) -> bool:
    """Whether a stored request (a batch line's) is an EmbedRequest's dict."""
    return data.get("endpoint") == EMBEDDINGS_ENDPOINT


def encode_vectors(float32_le: bytes) -> str:
    """Every vector's little-endian float32 bytes, concatenated, as the text a result row stores."""
    return base64.b64encode(float32_le).decode("ascii")


def decode_vectors(text: str, num_vectors: int) -> list[bytes]:
    """The stored text back as each vector's little-endian float32 bytes."""
    raw = base64.b64decode(text)
    width = len(raw) // num_vectors
    if width * num_vectors != len(raw) or width % FLOAT32_BYTES:
        raise ValueError(f"{len(raw)} bytes do not hold {num_vectors} float32 vectors")
    return [raw[i * width : (i + 1) * width] for i in range(num_vectors)]


def vector_floats(float32_le: bytes) -> list[float]:
    """One vector's components (each float32 is exactly a Python float)."""
    return list(struct.unpack(f"<{len(float32_le) // FLOAT32_BYTES}f", float32_le))


def embedding_answer(request: EmbedRequest, stored: str) -> dict[str, Any]:
    """OpenAI's embeddings response to `request` from `stored` (its result's text: every vector's float32 bytes in
    base64), in the request's encoding format."""
    vectors = decode_vectors(stored, len(request.inputs))
    return {
        "object": "list",
        "data": [embedding_object(index, vector, request.encoding_format) for index, vector in enumerate(vectors)],
        "model": request.model,
        "usage": {"prompt_tokens": request.num_prompt_tokens, "total_tokens": request.num_prompt_tokens},
    }


def embedding_object(index: int, float32_le: bytes, encoding_format: str) -> dict[str, Any]:
    value: str | list[float] = (
        base64.b64encode(float32_le).decode("ascii") if encoding_format == "base64" else vector_floats(float32_le)
    )
    return {"object": "embedding", "index": index, "embedding": value}
