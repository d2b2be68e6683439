"""What a request handler needs, built once per app: config, Redis, SQL sessions, Celery, each model's tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
from celery import Celery
from flask import current_app, g
from sqlalchemy.orm import Session

from api.errors import APIError
from api.gate.admission_slots import AdmissionGate
from api.gate.trusted_keys import TrustedKeys
from api.models.model_info import ModelInfo
from api.streaming.stream_hub import StreamHub
from tasks.config import Config
from tasks.store.db import SessionFactory


@dataclass(frozen=True)
class Services:
    config: Config
    redis: redis.Redis
    streams: StreamHub  # reads the request streams this process relays
    sessions: SessionFactory
    celery: Celery
    models: dict[str, ModelInfo]  # the served models by name, the default one first
    started_at: int
    admission_gate: AdmissionGate  # the generation requests this process admits at once
    # the principals of keys found in SQL in the last second (api/gate/auth.py)
    trusted_keys: TrustedKeys = field(default_factory=TrustedKeys)

    @property
    def model_info(self) -> ModelInfo:
        """The default model: what model-wide settings (the worker-wide steering profile and monitor) check against."""
        return next(iter(self.models.values()))


def services() -> Services:
    return current_app.extensions["steerbatch"]


def model_info_for(name: str) -> ModelInfo:
    """The served model `name`; 404 `model_not_found` (as OpenAI and vLLM answer) when it is not one."""
    models = services().models
    if name not in models:
        served = ", ".join(f"`{served}`" for served in models)
        raise APIError(
            404,
            f"The model `{name}` does not exist. This server serves {served}.",
            param="model",
            code="model_not_found",
        )
    return models[name]


def db_session() -> Session:
    if "db" not in g:
        g.db = services().sessions()
    return g.db


def close_db_session(_exc: BaseException | None = None) -> None:
    session = g.pop("db", None)
    if session is not None:
        session.close()
