"""The stop flags of the batches a worker's chunks run: a batch being cancelled or expired tells its chunks' inboxes
(`watch(batch_id, inbox.stop)`)."""

from __future__ import annotations

import redis

from tasks.batches.events import read_stop_flags
from tasks.batches.models import LineStatus
from tasks.config import Config
from worker.serving.flag_watcher import POLL_S, FlagWatcher


class StopWatcher(FlagWatcher[LineStatus]):
    def __init__(self, client: redis.Redis, config: Config, interval_s: float = POLL_S) -> None:
        super().__init__("batch-stop-watcher", lambda batch_ids: read_stop_flags(client, config, batch_ids), interval_s)
