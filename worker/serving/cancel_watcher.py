"""The cancel flags of the chat requests a worker runs: a client that left or asked to stop has its request's
engine requests cancelled (`watch(request_id, callback)`)."""

from __future__ import annotations

import redis

from tasks.config import Config
from tasks.streams.cancel_flags import read_cancel_flags
from worker.serving.flag_watcher import POLL_S, FlagWatcher


class CancelWatcher(FlagWatcher[bool]):
    def __init__(self, client: redis.Redis, config: Config, interval_s: float = POLL_S) -> None:
        def read(request_ids: list[str]) -> dict[str, bool]:
            return dict.fromkeys(read_cancel_flags(client, config, request_ids), True)

        super().__init__("cancel-watcher", read, interval_s)
