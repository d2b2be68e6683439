"""One pass of the request reaper, which every worker runs: requests are closed whether or not anyone watches them.

- A running request whose worker's lease lapsed fails with `worker_lost` (within `worker_lease_s` plus a pass).
- When Redis runs without persistence, a request still queued from before the server started was queued on a server
  that is gone, with its message: it fails with `queue_lost` instead of waiting for ever. (The api refuses new
  requests while Redis is down and enqueues each right after recording it, so nothing else is queued that early.)
- A queued or running request whose stream nobody has read for `stream_resume_grace_s` (its streaming client dropped
  and did not resume) is cancelled (tasks/streams/attachments.py): within the grace plus a pass.

Every close goes through `finish_request`, a conditional write, so any number of reapers may run at once."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis
from sqlalchemy import select

from tasks.config import Config
from tasks.messages.generation import ErrorInfo
from tasks.reapers.orphans import fail_if_orphaned
from tasks.store.db import SessionFactory
from tasks.store.finish import cancel_request, finish_request
from tasks.store.models import RequestRecord, RequestStatus
from tasks.streams.attachments import take_abandoned
from tasks.streams.worker_leases import is_worker_alive

logger = logging.getLogger(__name__)
QUEUE_LOST = ErrorInfo(
    "Redis restarted without persistence while this request waited in its queue; it never ran. Send it again.",
    "server_error",
    None,
    "queue_lost",
)
OPEN_STATUSES = (RequestStatus.QUEUED.value, RequestStatus.RUNNING.value)
MIN_INTERVAL_S = 0.5


def reaper_interval_s(config: Config) -> float:
    """Half a worker lease, or half the resume grace when that is shorter: a dead worker's requests fail within two
    leases, and an abandoned stream's request is cancelled within one and a half graces."""
    return max(MIN_INTERVAL_S, min(config.worker_lease_s, config.stream_resume_grace_s) / 2)


@dataclass(frozen=True)
class RedisServerState:
    started_at: float  # unix seconds, to the second
    is_persistent: bool  # append-only file on: queued messages survive a restart

    @classmethod
    def read(cls, client: redis.Redis) -> RedisServerState:
        server, persistence = client.info("server"), client.info("persistence")
        started_at = time.time() - float(server["uptime_in_seconds"])
        return cls(started_at, bool(persistence.get("aof_enabled")))


class RequestReaper:
    def __init__(self, sessions: SessionFactory, client: redis.Redis, config: Config) -> None:
        self._sessions = sessions
        self._client = client
        self._config = config

    def reap_once(self) -> None:
        self._cancel_abandoned()
        server = RedisServerState.read(self._client)
        if not server.is_persistent:
            self._fail_queued_before(server.started_at)
        # Leases live in Redis: right after a restart none exists yet, and a live worker is not an orphan.
        if time.time() - server.started_at > self._config.worker_lease_s:
            self._fail_orphans()

    def _cancel_abandoned(self) -> None:
        request_ids = take_abandoned(self._client, self._config)
        if not request_ids:
            return
        with self._sessions() as session:
            still_open = select(RequestRecord.id).where(
                RequestRecord.id.in_(request_ids), RequestRecord.status.in_(OPEN_STATUSES)
            )
            for request_id in list(session.scalars(still_open)):
                logger.info("nobody resumed the stream of %s in time; cancelling it", request_id)
                cancel_request(session, self._client, self._config, request_id)

    def _fail_orphans(self) -> None:
        with self._sessions() as session:
            running = select(RequestRecord.id, RequestRecord.worker).where(
                RequestRecord.status == RequestStatus.RUNNING.value
            )
            rows = session.execute(running).all()
        workers = {worker for _, worker in rows if worker is not None}
        dead = {worker for worker in workers if not is_worker_alive(self._client, self._config, worker)}
        for request_id, worker in rows:
            if worker in dead:
                fail_if_orphaned(self._sessions, self._client, self._config, request_id)

    def _fail_queued_before(self, restarted_at: float) -> None:
        # `created` is whole seconds: a request created in an earlier second than the server started was queued on
        # the server before it.
        with self._sessions() as session:
            lost = select(RequestRecord.id).where(
                RequestRecord.status == RequestStatus.QUEUED.value, RequestRecord.created < int(restarted_at)
            )
            request_ids = list(session.scalars(lost))
            for request_id in request_ids:
                finish_request(session, self._client, self._config, request_id, error=QUEUE_LOST)
        if request_ids:
            logger.warning("Redis restarted without persistence: %d queued requests lost their queue", len(request_ids))
