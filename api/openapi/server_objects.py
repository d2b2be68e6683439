"""The server's own answers as pydantic models, for the OpenAPI document only: the probes
(api/status/health_routes.py,
api/observability/readiness.py), /version and vLLM's /tokenize and /detokenize (api/chat/tokenize_routes.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, RootModel

from api.chat.tokenize_routes import ChatTokenize, PromptTokenize
from api.openapi.completion_objects import ErrorBody


class Health(BaseModel):
    status: Literal["ok"]
    model: str


class ByQueue(BaseModel):
    interactive: int
    bulk: int


class WorkerReadiness(BaseModel):
    name: str
    heartbeat_age_s: float = Field(description="seconds since the worker's last heartbeat")
    num_requests_running: int
    num_requests_waiting: ByQueue = Field(description="in the worker's engine")
    kv_cache_usage: float = Field(description="the share of the worker's KV cache blocks in use")


class ModelReadiness(BaseModel):
    status: Literal["ready", "unavailable"]
    workers: list[WorkerReadiness]
    queue_depth: ByQueue = Field(description="Celery messages not yet taken by a worker")
    num_requests_running: int
    num_requests_waiting: ByQueue = Field(description="in the queues and the engines")
    kv_cache_usage: float


class Readiness(BaseModel):
    """200: every served model has a live worker."""

    status: Literal["ready"]
    models: dict[str, ModelReadiness] = Field(description="by served model name")


class NotReady(BaseModel):
    """503: a served model has no live worker; `error` names it, in OpenAI's shape."""

    status: Literal["unavailable"]
    models: dict[str, ModelReadiness]
    error: ErrorBody


class Version(BaseModel):
    version: str = Field(description="the steerbatch package's version")


class TokenizeRequest(RootModel[PromptTokenize | ChatTokenize]):
    """`prompt`, tokenized as /v1/completions does, or `messages`, rendered and tokenized as /v1/chat/completions
    does; `model` (the default served model if left out) picks the tokenizer and chat template."""


class Tokenized(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = Field(description="with return_token_strs: each token's piece")


class Detokenized(BaseModel):
    prompt: str
