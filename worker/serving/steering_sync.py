"""A worker thread that keeps Redis and the engine in step about steering: it publishes the SAEs this worker's model
can use and the worker-wide monitor's statistics (both expire with the lease), and starts, restarts or stops the
worker-wide monitor when the api changes its settings."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from tasks.config import Config
from tasks.steering_store import publish_monitor_stats, publish_saes, read_monitor_settings
from worker.engine.continuous_engine import ContinuousEngine
from worker.steering.sae_attachments import SAEAttachments
from worker.steering.worker_monitor import WorkerMonitor, start_worker_monitor

logger = logging.getLogger(__name__)
SYNC_S = 1.0  # how soon a changed monitor setting reaches the engine
LISTINGS_PER_LEASE = 3  # the SAE listing is rescanned this often per lease, so it never lapses while alive


class SteeringSync:
    def __init__(
        self, client: redis.Redis, config: Config, worker: str, engine: ContinuousEngine, attachments: SAEAttachments
    ) -> None:
        self._client = client
        self._config = config
        self._worker = worker
        self._engine = engine
        self._attachments = attachments
        self._settings: dict[str, Any] | None = None
        self._monitor: WorkerMonitor | None = None
        self._listed_at = float("-inf")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sync_forever, name="steering-sync", daemon=True)

    def start(self) -> None:
        """Publishes once before returning, so the SAEs are listed by the time the worker takes requests."""
        self.sync()
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def sync(self) -> None:
        if time.monotonic() - self._listed_at >= self._config.worker_lease_s / LISTINGS_PER_LEASE:
            listings = [listing.to_dict() for listing in self._attachments.listings()]
            publish_saes(self._client, self._config, listings)
            self._listed_at = time.monotonic()
        settings = read_monitor_settings(self._client, self._config)
        if settings != self._settings:
            self._apply(settings)
        stats = None if self._monitor is None else {**self._monitor.stats.snapshot(), "settings": self._settings}
        publish_monitor_stats(self._client, self._config, self._worker, stats)

    def _apply(self, settings: dict[str, Any] | None) -> None:
        self._settings, monitor = settings, None
        if settings is not None:
            try:
                monitor = start_worker_monitor(self._attachments, settings["sae_id"], settings["features"])
            except ValueError as exc:
                logger.warning("worker-wide monitor %s not started: %s", settings, exc)
        self._engine.set_worker_monitor(monitor)
        self._monitor = monitor
        logger.info("worker-wide monitor: %s", settings or "off")

    def _sync_forever(self) -> None:
        while not self._stopped.wait(SYNC_S):
            try:
                self.sync()
            except redis.RedisError as exc:
                logger.warning("could not sync steering state of %s: %s", self._worker, exc)
