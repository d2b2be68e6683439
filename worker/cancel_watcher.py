"""One thread per worker reads the cancel flags of the chat requests it runs, all in one round trip every
`interval_s`, and cancels those whose client left or asked to stop. Each request's thread polling Redis itself, 20
times a second, woke as many threads as requests in flight and took the GIL from the engine thread, as chunk
threads did before the batch stop watcher (worker/batch_stops.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from tasks.config import Config
from tasks.streams import read_cancel_flags
from worker.periodic import PeriodicThread

logger = logging.getLogger(__name__)
POLL_S = 0.05  # how soon a running request sees its cancel flag


class CancelWatcher:
    def __init__(self, client: redis.Redis, config: Config, interval_s: float = POLL_S) -> None:
        self._client = client
        self._config = config
        self._lock = threading.Lock()
        self._on_cancel: dict[str, Callable[[], None]] = {}  # by request id
        self._is_failing = False  # Redis failed the last pass: warned once, not 20 times a second
        self._thread = PeriodicThread("cancel-watcher", interval_s, self._watch_once)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def watch(self, request_id: str, on_cancel: Callable[[], None]) -> None:
        """Calls `on_cancel` once, from the watcher's thread, when the request's cancel flag is set."""
        with self._lock:
            self._on_cancel[request_id] = on_cancel

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._on_cancel.pop(request_id, None)

    def _watch_once(self) -> None:
        with self._lock:
            watched = list(self._on_cancel)
        if not watched:
            return
        try:
            cancelled = read_cancel_flags(self._client, self._config, watched)
        except redis.RedisError as exc:  # the next pass tries again
            if not self._is_failing:
                logger.warning("could not read the cancel flags of %d requests (retrying): %s", len(watched), exc)
            self._is_failing = True
            return
        if self._is_failing:
            logger.info("reading cancel flags again")
            self._is_failing = False
        for request_id in cancelled:
            with self._lock:
                on_cancel = self._on_cancel.pop(request_id, None)
            if on_cancel is not None:
                on_cancel()
