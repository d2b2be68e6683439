"""The stop watcher on a real Redis: the chunks of a stopping batch hear of it, the others do not."""

from __future__ import annotations

import uuid

import redis

from tasks.batches.events import set_stop_flag
from tasks.batches.models import LineStatus
from tasks.config import Config
from worker.serving.batch_inbox import ChunkInbox
from worker.serving.batch_stops import StopWatcher


def test_the_chunks_of_a_stopping_batch_are_told_and_no_others(redis_url: str) -> None:
    config = Config(redis_url=redis_url, is_redis_embedded=False, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    watcher = StopWatcher(client, config, interval_s=0.01)
    cancelled, expired, running, forgotten = ChunkInbox(), ChunkInbox(), ChunkInbox(), ChunkInbox()
    for batch_id, inbox in (("b1", cancelled), ("b2", expired), ("b3", running), ("b1", forgotten)):
        watcher.watch(batch_id, inbox.stop)
    watcher.forget("b1", forgotten.stop)
    watcher.start()
    try:
        set_stop_flag(client, config, "b1", LineStatus.CANCELLED)
        set_stop_flag(client, config, "b2", LineStatus.EXPIRED)
        assert cancelled.has_news.wait(5) and expired.has_news.wait(5)
        assert (cancelled.stopped_as, expired.stopped_as) == (LineStatus.CANCELLED, LineStatus.EXPIRED)
        assert not running.has_news.is_set() and running.stopped_as is None
        assert not forgotten.has_news.is_set() and forgotten.stopped_as is None
    finally:
        watcher.stop()
        client.delete(*client.keys(f"{config.redis_prefix}*"))
