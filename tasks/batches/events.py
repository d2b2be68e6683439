"""A batch's progress stream in Redis: a status event on every status change, one line event per finished line."""

from __future__ import annotations

import json
import logging

import redis
from sqlalchemy.orm import Session

from tasks.batches.messages import BatchEvent, BatchEventType
from tasks.batches.models import BatchLine, BatchRecord, LineStatus
from tasks.batches.store import request_counts
from tasks.config import Config
from tasks.streams.events import EVENT_FIELD, append_json_many
from tasks.streams.redis_keys import RedisKeys

logger = logging.getLogger(__name__)


def publish_status(client: redis.Redis, config: Config, session: Session, batch_id: str) -> None:
    batch = session.get(BatchRecord, batch_id, populate_existing=True)
    if batch is not None:
        event = BatchEvent(BatchEventType.STATUS, batch.status, request_counts(session, batch_id))
        _append(client, config, batch_id, [event])


# A line's event is published in the transaction that records the line, before its commit (`finish_lines`), so that
# the batch's closer, which closes only once no line is open, publishes its final status after every line's event. A
# worker killed between the two has published a line that then runs again and is published again: the set of the
# batch's published line numbers, beside its stream, keeps that second event out, in the same script as the XADD.
# KEYS[1]: the batch's stream, KEYS[2]: its set of published line numbers. ARGV: the entry's field name, MAXLEN, the
# TTL in seconds, then (line number, event JSON) pairs. Returns how many events it appended.
APPEND_LINES_ONCE = """
local field, maxlen, ttl, appended = ARGV[1], ARGV[2], ARGV[3], 0
for i = 4, #ARGV, 2 do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', field, ARGV[i + 1])
    appended = appended + 1
  end
end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
return appended
"""


def publish_lines(
    client: redis.Redis, config: Config, session: Session, batch_id: str, finished: list[tuple[BatchLine, LineStatus]]
) -> None:
    """A line event for each line just finished, all carrying the counts after them, in one round trip; a line
    already published (by a run of it that died before its commit) is not published again."""
    if not finished:
        return
    batch = session.get(BatchRecord, batch_id)
    status, counts = batch.status if batch else "", request_counts(session, batch_id)
    pairs: list[str | int] = []
    for line, line_status in finished:
        event = BatchEvent(BatchEventType.LINE, status, counts, line.line_no, line.custom_id, line_status.value)
        pairs += (line.line_no, json.dumps(event.to_dict()))
    keys = RedisKeys(config.redis_prefix)
    try:  # progress is advisory (SQL holds the truth), as in `_append`
        client.eval(
            APPEND_LINES_ONCE,
            2,
            keys.batch_stream(batch_id),
            keys.batch_published_lines(batch_id),
            EVENT_FIELD,
            config.stream_maxlen,
            config.stream_ttl_s,
            *pairs,
        )
    except redis.RedisError as exc:
        logger.warning("could not publish progress of %s: %s", batch_id, exc)


def _append(client: redis.Redis, config: Config, batch_id: str, events: list[BatchEvent]) -> None:
    # Progress is advisory (SQL holds the truth), so a Redis hiccup must not fail the line or the batch.
    try:
        key = RedisKeys(config.redis_prefix).batch_stream(batch_id)
        append_json_many(client, config, key, [event.to_dict() for event in events])
    except redis.RedisError as exc:
        logger.warning("could not publish progress of %s: %s", batch_id, exc)


def set_stop_flag(client: redis.Redis, config: Config, batch_id: str, status: LineStatus) -> None:
    """Tell the workers running this batch's lines to end them, with `status`, at the next step."""
    client.set(RedisKeys(config.redis_prefix).batch_stop_flag(batch_id), status.value, ex=config.stream_ttl_s)


def read_stop_flags(client: redis.Redis, config: Config, batch_ids: list[str]) -> dict[str, LineStatus]:
    """The batches of `batch_ids` that are stopping, with the status their running lines end with."""
    keys = RedisKeys(config.redis_prefix)
    values = client.mget([keys.batch_stop_flag(batch_id) for batch_id in batch_ids])
    return {batch_id: LineStatus(value) for batch_id, value in zip(batch_ids, values, strict=True) if value}
