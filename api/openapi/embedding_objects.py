"""The embeddings endpoint's response as pydantic models, for the OpenAPI document only (api/embeddings/objects.py
builds it as a dict)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(
        description="the L2-normalised vector; with encoding_format base64, its little-endian float32 bytes in base64"
    )


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
