"""What a request handler needs, built once per app: config, Redis, SQL sessions, Celery, each model's tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis
from celery import Celery
from flask import current_app, g
from sqlalchemy.orm import Session

from api.prompts import ModelInfo
from api.stream_hub import StreamHub
from tasks.config import Config
from tasks.db import SessionFactory

if TYPE_CHECKING:  # api/admission_gate.py reads the services itself
    from api.admission_gate import AdmissionGate


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

    @property
    def model_info(self) -> ModelInfo:
        """The default model: what model-wide settings (the worker-wide steering profile and monitor) check against."""
        return next(iter(self.models.values()))


def services() -> Services:
    return current_app.extensions["steerbatch"]


def db_session() -> Session:
    if "db" not in g:
        g.db = services().sessions()
    return g.db


def close_db_session(_exc: BaseException | None = None) -> None:
    session = g.pop("db", None)
    if session is not None:
        session.close()
