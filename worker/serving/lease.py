"""The worker's liveness lease in Redis, renewed from its own thread while the worker is healthy, with its stats and
metrics (tasks/streams/worker_stats.py) beside it."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable

import redis

from tasks.config import Config
from tasks.streams.worker_leases import renew_worker_lease
from tasks.streams.worker_stats import WorkerStats, publish_worker_stats

logger = logging.getLogger(__name__)
RENEWALS_PER_LEASE = 3  # a lease survives two missed renewals


def incarnation_name(hostname: str) -> str:
    """This worker process's name for claims and leases: its Celery hostname and a token drawn at start. A supervisor
    restarts a dead worker under the same hostname; with its own token, the new process never renews the dead one's
    lease, so the reapers see that lease lapse and fail the requests the dead one had claimed."""
    return f"{hostname}/{uuid.uuid4().hex[:8]}"


class WorkerLease:
    def __init__(
        self,
        client: redis.Redis,
        config: Config,
        worker: str,
        is_healthy: Callable[[], bool],
        read_stats: Callable[[], WorkerStats] | None = None,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.worker = worker
        self._is_healthy = is_healthy
        self._read_stats = read_stats
        self._on_error = on_error  # told of each failed renewal
        self._client = client
        self._config = config
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._renew_forever, name="worker-lease", daemon=True)

    def start(self) -> None:
        self._renew()  # the stats too, so a live worker is never without them for a whole renewal period
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _renew_forever(self) -> None:
        while not self._stopped.wait(self._config.worker_lease_s / RENEWALS_PER_LEASE):
            if not self._is_healthy():
                logger.error("%s is unhealthy; letting its lease lapse so its requests fail", self.worker)
                return
            try:
                self._renew()
            except redis.RedisError as exc:
                logger.warning("could not renew the lease of %s: %s", self.worker, exc)
                if self._on_error is not None:
                    self._on_error(exc)

    def _renew(self) -> None:
        renew_worker_lease(self._client, self._config, self.worker)
        if self._read_stats is not None:
            publish_worker_stats(self._client, self._config, self._read_stats())
