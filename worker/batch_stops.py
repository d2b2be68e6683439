"""One thread per worker reads the stop flags of the batches its chunks run, all in one round trip every `interval_s`,
and tells the chunks of a stopped batch. Chunk threads polling Redis themselves, 20 times a second each, took the
GIL from the engine thread often enough to slow every decode step by about 5 %."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

import redis

from tasks.batch_events import read_stop_flags
from tasks.config import Config
from worker.batch_inbox import ChunkInbox
from worker.periodic import PeriodicThread

logger = logging.getLogger(__name__)
POLL_S = 0.05  # how soon running lines see their batch cancelled or expired


class StopWatcher:
    def __init__(self, client: redis.Redis, config: Config, interval_s: float = POLL_S) -> None:
        self._client = client
        self._config = config
        self._lock = threading.Lock()
        self._inboxes: defaultdict[str, list[ChunkInbox]] = defaultdict(list)  # by batch id
        self._thread = PeriodicThread("batch-stop-watcher", interval_s, self._watch_once)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def watch(self, batch_id: str, inbox: ChunkInbox) -> None:
        with self._lock:
            self._inboxes[batch_id].append(inbox)

    def forget(self, batch_id: str, inbox: ChunkInbox) -> None:
        with self._lock:
            self._inboxes[batch_id].remove(inbox)
            if not self._inboxes[batch_id]:
                del self._inboxes[batch_id]

    def _watch_once(self) -> None:
        with self._lock:
            watched = {batch_id: list(inboxes) for batch_id, inboxes in self._inboxes.items()}
        if not watched:
            return
        try:
            stopped = read_stop_flags(self._client, self._config, list(watched))
        except redis.RedisError as exc:  # a renewal also sees a stop, in SQL
            logger.warning("could not read the stop flags of %d batches: %s", len(watched), exc)
            return
        for batch_id, status in stopped.items():
            for inbox in watched[batch_id]:
                inbox.stop(status)
