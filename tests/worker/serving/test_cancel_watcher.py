"""The cancel watcher on a real Redis: requests whose cancel flag is set hear of it once, the others never."""

from __future__ import annotations

import threading
import uuid

import redis

from tasks.config import Config
from tasks.streams.cancel_flags import read_cancel_flags, request_cancel
from worker.serving.cancel_watcher import CancelWatcher


def test_flagged_requests_are_cancelled_once_and_no_others(redis_url: str) -> None:
    config = Config(redis_url=redis_url, is_redis_embedded=False, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    watcher = CancelWatcher(client, config, interval_s=0.01)
    calls: dict[str, int] = {"left": 0, "running": 0, "forgotten": 0}
    cancelled = threading.Event()

    callbacks = {request_id: lambda _, request_id=request_id: on_cancel(request_id) for request_id in calls}

    def on_cancel(request_id: str) -> None:
        calls[request_id] += 1
        cancelled.set()

    for request_id, callback in callbacks.items():
        watcher.watch(request_id, callback)
    watcher.forget("forgotten", callbacks["forgotten"])
    watcher.start()
    try:
        request_cancel(client, config, "left")
        request_cancel(client, config, "forgotten")
        assert cancelled.wait(5)
        watcher._watch_once()  # another pass with the flags still set
        assert calls == {"left": 1, "running": 0, "forgotten": 0}
        assert read_cancel_flags(client, config, ["left", "running", "forgotten"]) == {"left", "forgotten"}
    finally:
        watcher.stop()
        client.delete(*client.keys(f"{config.redis_prefix}*"))
