"""What every Celery task thread of a worker runs with: the engine, the tokenizer, Redis, SQL, its own name and the
worker's metrics."""

from __future__ import annotations

import redis
from transformers import PreTrainedTokenizerFast

from tasks.config import Config
from tasks.store.db import SessionFactory
from worker.engine.interface import Engine
from worker.serving.metrics import ServingMetrics


class TaskRunner:
    """Base of the runners of chat requests and batch chunks."""

    def __init__(
        self,
        config: Config,
        engine: Engine,
        tokenizer: PreTrainedTokenizerFast,
        client: redis.Redis,
        sessions: SessionFactory,
        worker: str,
        metrics: ServingMetrics,
    ) -> None:
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.redis = client
        self.sessions = sessions
        self.worker = worker  # this worker process: its Celery node name and start token, which claim and hold leases
        self.metrics = metrics
