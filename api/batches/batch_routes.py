"""POST /v1/batches, GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel, GET .../events"""

from __future__ import annotations

import json
import logging
import time

from flask import Blueprint, Response, jsonify, request
from pydantic import Field
from sqlalchemy import select

from api.batches.batch_objects import batch_object
from api.batches.file_expiry import ExpiresAfter, checked_expiry_s
from api.batches.file_routes import find_file
from api.batches.lines import URL_ENDPOINTS
from api.batches.pages import cursor_page, page_limit
from api.batches.relay import batch_frames
from api.batches.validation import batch_validator
from api.chat.schemas import StrictModel
from api.errors import APIError
from api.gate.auth import current_principal
from api.gate.idempotency import check_replay, commit_once, idempotency_key, request_hash
from api.gate.request_limits import read_json_object
from api.services import db_session, services
from api.streaming.sse import last_event_id, sse_response
from tasks.batches.events import publish_status, set_stop_flag
from tasks.batches.finalize import finalize_if_done
from tasks.batches.messages import BatchEvent, BatchEventType
from tasks.batches.models import BatchRecord, BatchStatus, LineStatus
from tasks.batches.store import begin_cancel, new_sortable_id, request_counts
from tasks.streams.redis_keys import RedisKeys

logger = logging.getLogger(__name__)
bp = Blueprint("batches", __name__)
COMPLETION_WINDOWS = {"24h": 24 * 3600}
MAX_LIST_LIMIT = 100
DEFAULT_LIST_LIMIT = 20


class BatchCreate(StrictModel):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = Field(None, max_length=16)
    output_expires_after: ExpiresAfter | None = None  # the output and error files expire this long after written


@bp.post("/v1/batches")
def create_batch() -> Response:
    body = read_json_object()
    create = BatchCreate.model_validate(body)
    if create.endpoint not in URL_ENDPOINTS:
        raise APIError(400, f"endpoint must be one of {sorted(URL_ENDPOINTS)}", param="endpoint")
    if create.completion_window not in COMPLETION_WINDOWS:
        raise APIError(400, f"completion_window must be one of {sorted(COMPLETION_WINDOWS)}", param="completion_window")
    checked_expiry_s(create.output_expires_after, services().config, "output_expires_after")
    key = idempotency_key()
    digest = request_hash(json.dumps(body, sort_keys=True).encode())
    if key is not None and (earlier := _by_key(key)) is not None:
        check_replay(earlier, digest)
        return jsonify(batch_object(db_session(), earlier))
    input_file = find_file(create.input_file_id)
    if input_file.purpose != "batch":
        raise APIError(
            400, f"File {input_file.id} has purpose {input_file.purpose!r}, not 'batch'.", param="input_file_id"
        )
    batch, is_new = _record_validating(create, key, digest)
    if is_new:
        batch_validator().submit(batch.id)  # in the background: the batch answers `validating` at once
    session = db_session()
    session.refresh(batch)
    return jsonify(batch_object(session, batch))


def _record_validating(create: BatchCreate, key: str | None, digest: str) -> tuple[BatchRecord, bool]:
    """The batch row, committed with its validation lease before anything is validated or enqueued, and True; or the
    earlier one with this key, and False."""
    now = int(time.time())
    principal = current_principal()
    batch = BatchRecord(
        id=new_sortable_id("batch_"),
        tenant=principal.tenant,
        endpoint=create.endpoint,
        model=services().model_info.name,
        input_file_id=create.input_file_id,
        completion_window=create.completion_window,
        status=BatchStatus.VALIDATING.value,
        batch_metadata=create.metadata,
        created_at=now,
        expires_at=now + COMPLETION_WINDOWS[create.completion_window],
        idempotency_key=key,
        request_hash=digest,
        validation_lease_expires_at=now + services().config.batch_validation_lease_s,
        output_expires_after_s=create.output_expires_after.seconds if create.output_expires_after else None,
    )
    stored = commit_once(batch, key, digest, _by_key)
    logger.info("batch %s from key %s (tenant %s)", stored.id, principal.key_name, principal.tenant)
    return stored, stored is batch


def _by_key(key: str) -> BatchRecord | None:
    tenant = current_principal().tenant
    return db_session().scalar(
        select(BatchRecord).where(BatchRecord.tenant == tenant, BatchRecord.idempotency_key == key)
    )


def _find(batch_id: str) -> BatchRecord:
    """The caller's batch; another tenant's gets the same 404 as a missing one."""
    batch = db_session().get(BatchRecord, batch_id, populate_existing=True)
    if batch is None or batch.tenant != current_principal().tenant:
        raise APIError(404, f"No batch with id `{batch_id}`.", param="batch_id", code="not_found")
    return batch


@bp.get("/v1/batches/<batch_id>")
def retrieve_batch(batch_id: str) -> Response:
    return jsonify(batch_object(db_session(), _find(batch_id)))


@bp.get("/v1/batches")
def list_batches() -> Response:
    limit = page_limit(DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
    tenant = current_principal().tenant
    query = select(BatchRecord).where(BatchRecord.tenant == tenant).order_by(BatchRecord.id.desc()).limit(limit + 1)
    after = request.args.get("after")
    if after:
        query = query.where(BatchRecord.id < after)
    session = db_session()
    batches = list(session.scalars(query))
    data = [batch_object(session, batch) for batch in batches[:limit]]
    return jsonify(cursor_page(data, has_more=len(batches) > limit))


@bp.post("/v1/batches/<batch_id>/cancel")
def cancel_batch(batch_id: str) -> Response:
    """Stops dispatch now and running lines at their next step; lines already finished stay in the output."""
    svc = services()
    session = db_session()
    _find(batch_id)
    if begin_cancel(session, batch_id):
        set_stop_flag(svc.redis, svc.config, batch_id, LineStatus.CANCELLED)
        publish_status(svc.redis, svc.config, session, batch_id)
        if finalize_if_done(session, batch_id):
            publish_status(svc.redis, svc.config, session, batch_id)
    return jsonify(batch_object(session, _find(batch_id)))


@bp.get("/v1/batches/<batch_id>/events")
def batch_events(batch_id: str) -> Response:
    """Progress after Last-Event-ID: a status event per status change, a line event per finished line."""
    _find(batch_id)
    svc = services()

    def final_event() -> BatchEvent | None:
        with svc.sessions() as session:
            batch = session.get(BatchRecord, batch_id)
            if batch is None or not batch.is_finished:
                return None
            return BatchEvent(BatchEventType.STATUS, batch.status, request_counts(session, batch_id))

    key = RedisKeys(svc.config.redis_prefix).batch_stream(batch_id)
    frames = batch_frames(
        svc.redis, key, last_event_id(), heartbeat_s=svc.config.sse_heartbeat_s, final_event=final_event
    )
    return sse_response(frames)
