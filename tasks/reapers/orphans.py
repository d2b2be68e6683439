"""Requests whose worker died: whoever waits on one notices the lapsed lease and records its one error; and requests
finished in SQL whose final stream event was lost: whoever waits on one writes it."""

from __future__ import annotations

import logging

import redis
from sqlalchemy.exc import SQLAlchemyError

from tasks.config import Config
from tasks.messages.generation import ErrorInfo
from tasks.store.db import SessionFactory
from tasks.store.finish import end_stream_if_finished, finish_request
from tasks.store.models import RequestStatus
from tasks.store.request_store import get_request
from tasks.streams.cancel_flags import request_cancel
from tasks.streams.worker_leases import is_worker_alive

logger = logging.getLogger(__name__)
WORKER_LOST = ErrorInfo("The worker running this request stopped; it was not finished.", "server_error", None,
                        "worker_lost")  # fmt: skip


def fail_if_orphaned(sessions: SessionFactory, client: redis.Redis, config: Config, request_id: str) -> bool:
    """True if the request was running on a worker whose lease lapsed and this call failed it."""
    with sessions() as session:
        record = get_request(session, request_id)
        if record is None or record.status != RequestStatus.RUNNING.value or record.worker is None:
            return False
        if is_worker_alive(client, config, record.worker):
            return False
        logger.warning("worker %s stopped renewing its lease; failing %s", record.worker, request_id)
        request_cancel(client, config, request_id)  # if the worker was only slow, it stops now
        return finish_request(session, client, config, request_id, error=WORKER_LOST)


def settle_quiet_request(sessions: SessionFactory, client: redis.Redis, config: Config, request_id: str) -> None:
    """What a reader does when a request's stream goes quiet: a request finished in SQL gets the final event its
    stream lacks (a Redis crash took the worker's XADD), and one whose worker died fails. A database error is logged
    and the check left to the next quiet spell: a check must not end the stream it watches (a Redis error still
    does, as the reader's own reads would)."""
    try:
        with sessions() as session:
            record = get_request(session, request_id)
            if record is not None and record.is_finished:
                end_stream_if_finished(session, client, config, request_id)
                return
        fail_if_orphaned(sessions, client, config, request_id)
    except SQLAlchemyError as exc:
        logger.warning("could not check the quiet request %s in the database: %s", request_id, exc)
