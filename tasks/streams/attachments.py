"""Who reads a request's stream, so that a streaming client that drops can come back before its request is cancelled.

A client that drops does not cancel its request: for `stream_resume_grace_s` it (or another client of its tenant)
may resume with Last-Event-ID. The bookkeeping is in Redis, so the grace outlives the api process that relayed the
stream, and every worker's request reaper enforces it (`take_abandoned`), so a request nobody came back for still
frees the GPU.

- `attachers:<request id>`: the relays reading the stream now, each scored by when its lease ends. A relay renews its
  lease (`LEASE_HEARTBEATS` SSE heartbeats long) as frames go out, at most once a heartbeat; a relay in an api process
  that died stops counting when its lease ends. The key expires a grace after the last lease it holds ends.
- `streams:detached`: request ids, each scored by when a reaper looks at it. Attaching puts it a lease and a grace
  away (a relay whose api dies leaves a full grace after its lease ends); a client dropping puts it a grace away.
  When it is due, a reaper cancels the request if no relay held a lease within the last grace, and otherwise looks
  again a grace after the latest lease ends.

An entry leaves the set only through a reaper, in a transaction watching the request's attachers: exactly one reaper
takes it, and an attach or detach at that moment wins. Every relay detaches the same way, however it ended: the
reaper cancels only a request still queued or running (tasks/reapers/request_reaper.py)."""

from __future__ import annotations

import logging
import math
import time
import uuid

import redis

from tasks.config import Config
from tasks.streams.redis_keys import RedisKeys

logger = logging.getLogger(__name__)
LEASE_HEARTBEATS = 3  # a relay renews at most once a heartbeat; a lease of three survives a late one or two
REAP_BATCH = 500  # due entries one reaper pass looks at; the next pass takes the rest


def lease_s(config: Config) -> float:
    return LEASE_HEARTBEATS * config.sse_heartbeat_s


class StreamAttachment:
    """One relay's hold on a request's stream, from `attach` to `detach`. A Redis failure is logged, not raised: the
    relay itself tells its client when Redis fails, and the request then runs to its end unwatched."""

    def __init__(self, client: redis.Redis, config: Config, request_id: str) -> None:
        self.request_id = request_id
        self._client = client
        self._config = config
        self._keys = RedisKeys(config.redis_prefix)
        self._attacher = uuid.uuid4().hex
        self._renewed_at = 0.0  # time.monotonic() of the last renewal

    def hold(self) -> None:
        """Count as a reader from now; should this relay vanish, the request still gets a grace after its lease."""
        self._hold(is_new=True)

    def renew_if_due(self) -> None:
        if time.monotonic() - self._renewed_at >= self._config.sse_heartbeat_s:
            self._hold(is_new=False)

    def detach(self) -> None:
        """The relay ended: the request runs on for a grace, for someone to resume it."""
        pipe = self._client.pipeline(transaction=True)
        pipe.zrem(self._keys.stream_attachers(self.request_id), self._attacher)
        pipe.zadd(self._keys.detached_streams(), {self.request_id: time.time() + self._config.stream_resume_grace_s})
        self._run(pipe, "detach from")

    def _hold(self, *, is_new: bool) -> None:
        lease_end = time.time() + lease_s(self._config)
        attachers = self._keys.stream_attachers(self.request_id)
        pipe = self._client.pipeline(transaction=True)
        pipe.zadd(attachers, {self._attacher: lease_end})
        pipe.expire(attachers, math.ceil(lease_s(self._config) + self._config.stream_resume_grace_s))
        if is_new:
            look_at = lease_end + self._config.stream_resume_grace_s
            pipe.zadd(self._keys.detached_streams(), {self.request_id: look_at}, gt=True)
        self._run(pipe, "attach to" if is_new else "renew the lease on")
        self._renewed_at = time.monotonic()

    def _run(self, pipe: redis.client.Pipeline, action: str) -> None:
        try:
            pipe.execute()
        except redis.RedisError as exc:
            logger.warning("could not %s the stream of %s: %s", action, self.request_id, exc)


def attach(client: redis.Redis, config: Config, request_id: str) -> StreamAttachment:
    """A new relay of `request_id`'s stream: it counts as a reader until it detaches or its lease ends."""
    attachment = StreamAttachment(client, config, request_id)
    attachment.hold()
    return attachment


def take_abandoned(client: redis.Redis, config: Config) -> list[str]:
    """Requests whose stream nobody has read for a grace, each taken off the detached set by exactly one caller."""
    now = time.time()
    key = RedisKeys(config.redis_prefix).detached_streams()
    due = client.zrangebyscore(key, "-inf", now, start=0, num=REAP_BATCH)
    return [request_id for request_id in due if _take_if_unread(client, config, request_id, now)]


def _take_if_unread(client: redis.Redis, config: Config, request_id: str, now: float) -> bool:
    """True if this call took `request_id` off the set: no lease on its stream ended within the last grace. Otherwise
    its next look moves to a grace after the latest lease ends; an attach or detach meanwhile leaves it as that made
    it."""
    keys = RedisKeys(config.redis_prefix)
    attachers = keys.stream_attachers(request_id)
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(attachers)
            latest = pipe.zrevrange(attachers, 0, 0, withscores=True)
            read_until = latest[0][1] if latest else 0.0
            is_abandoned = read_until + config.stream_resume_grace_s <= now
            pipe.multi()
            if is_abandoned:
                pipe.zrem(keys.detached_streams(), request_id)
            else:
                pipe.zadd(keys.detached_streams(), {request_id: read_until + config.stream_resume_grace_s})
            [changed] = pipe.execute()
        except redis.WatchError:
            return False
    return is_abandoned and changed == 1
