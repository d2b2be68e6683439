"""What every Celery task thread of a worker runs with: the engine, the tokenizer, Redis, SQL, its own name and the
worker's metrics."""

from __future__ import annotations

import logging

import redis
from transformers import PreTrainedTokenizerFast

from tasks.config import Config
from tasks.reapers.orphans import fail_if_orphaned
from tasks.store.db import SessionFactory
from tasks.store.models import TERMINAL_STATUSES, RequestStatus
from tasks.store.request_store import claim_request
from worker.engine.interface import Engine
from worker.serving.metrics import ServingMetrics

logger = logging.getLogger(__name__)


class TaskRunner:
    """Base of the runners of chat requests, embeddings and batch chunks."""

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

    def claim(self, request_id: str) -> bool:
        """Moves the request's row from queued to running on this worker; False when there is nothing to run: unknown,
        already finished, or redelivered after a worker died."""
        previous = self.status_before_claim(request_id)
        if previous is None:
            logger.warning("request %s is not in the database; dropping it", request_id)
            return False
        if previous in TERMINAL_STATUSES:
            logger.info("request %s already finished; skipping the redelivery", request_id)
            return False
        if previous == RequestStatus.RUNNING:
            # Another worker took it: rerunning could repeat text a client has already seen. If that worker died,
            # the request ends as the reapers end it; if it lives, it is still running there.
            fail_if_orphaned(self.sessions, self.redis, self.config, request_id)
            return False
        return True

    def status_before_claim(self, request_id: str) -> RequestStatus | None:
        """Claims the request's row alone, in a transaction of its own; a runner whose requests start together claims
        them together."""
        with self.sessions() as session:
            return claim_request(session, request_id, self.worker)
