"""GET /v1/requests/{id}, its events (replay and follow), and cancel."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from api.chat.generation import cancel_generation, stream_response
from api.chat.objects import request_object
from api.errors import APIError
from api.gate.auth import current_principal
from api.services import db_session, services
from api.streaming.sse import DONE, FRAME_ID, ResumePoint, last_event_id, sse_frame, sse_response
from tasks.messages.embeddings import EMBEDDINGS_ENDPOINT
from tasks.store.models import RequestRecord
from tasks.store.request_store import get_owned_request
from tasks.streams.redis_keys import RedisKeys

bp = Blueprint("requests", __name__)


def _find(request_id: str) -> RequestRecord:
    """The caller's request; another tenant's gets the same 404 as a missing one, so ids leak nothing."""
    record = get_owned_request(db_session(), request_id, current_principal().tenant)
    if record is None or record.endpoint == EMBEDDINGS_ENDPOINT:  # an embeddings request has no completion to show
        raise APIError(404, f"No request with id `{request_id}`.", param="request_id", code="not_found")
    return record


@bp.get("/v1/requests/<request_id>")
def retrieve_request(request_id: str) -> Response:
    return jsonify(request_object(_find(request_id), services().config.tool_call_parser))


@bp.get("/v1/requests/<request_id>/events")
def request_events(request_id: str) -> Response:
    """Replays the stream after Last-Event-ID and follows it. Leaving never cancels at once: a running request goes
    on for STREAM_RESUME_GRACE_S, for this or another client to resume; only the cancel route stops it now."""
    record = _find(request_id)
    after_id = last_event_id(FRAME_ID)
    svc = services()
    key = RedisKeys(svc.config.redis_prefix).request_stream(request_id)
    if record.is_finished:
        if not svc.redis.exists(key):
            raise APIError(410, "The event stream has expired; GET the request for its result.", code="stream_expired")
        if not svc.redis.xrange(key, min=ResumePoint.parse(after_id).entry_id, count=1):
            return sse_response(iter([sse_frame(DONE, after_id)]))  # an id past the final event: nothing is left
    return stream_response(record, after_id)


@bp.post("/v1/requests/<request_id>/cancel")
def cancel_request(request_id: str) -> Response:
    record = _find(request_id)
    if not record.is_finished:
        cancel_generation(request_id)
        db_session().expire_all()
        record = _find(request_id)
    return jsonify(request_object(record, services().config.tool_call_parser))
