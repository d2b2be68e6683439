"""The path chat and completions share: record, enqueue, then stream or wait for the result."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence

from flask import Response, jsonify

from api.chat.objects import completion_object
from api.chat.prompts import echo_start
from api.chat.relay import relay_frames
from api.chat.sampling import prompts_sampling_params
from api.chat.schemas import GenerationFields
from api.errors import APIError
from api.gate.admission import admit
from api.gate.admission_hooks import release_admission_slot
from api.gate.auth import current_principal
from api.gate.request_ids import note_request_id
from api.models.model_info import ModelInfo
from api.services import db_session, services
from api.steering.specs import steering_and_monitor
from api.streaming.client_connection import is_client_gone
from api.streaming.sse import resumable_response, sse_response
from api.structured.grammar import request_grammar
from api.structured.tools import NO_TOOLS, ToolPlan
from tasks.celery_app import enqueue_generate
from tasks.messages.generation import Endpoint, ErrorInfo, GenerateRequest, StreamEvent, error_status_code
from tasks.messages.stream_chunks import StreamMeta
from tasks.reapers.orphans import settle_quiet_request
from tasks.store.finish import cancel_request
from tasks.store.models import RequestRecord, RequestStatus
from tasks.store.request_store import create_request, get_request, record_result
from tasks.streams.attachments import StreamAttachment, attach
from tasks.streams.events import STREAM_START, wait_for_final
from tasks.streams.redis_keys import RedisKeys

logger = logging.getLogger(__name__)
ID_PREFIX = {Endpoint.CHAT: "chatcmpl-", Endpoint.COMPLETIONS: "cmpl-"}


def build_generate_request(
    info: ModelInfo,
    endpoint: Endpoint,
    fields: GenerationFields,
    prompt_ids: list[int],
    tenant: str,
    tools: ToolPlan = NO_TOOLS,
    more_prompt_ids: Sequence[list[int]] = (),
) -> GenerateRequest:
    """`tenant`'s request to the worker for validated fields: sampling, steering, monitor and grammar checked against
    the model; a completion's further prompts run beside the first, `n` choices each."""
    prompts = [prompt_ids, *more_prompt_ids]
    sampling = prompts_sampling_params(info, fields, prompts)
    grammar = request_grammar(info.tokenizer, fields, tools.grammar)
    longest = max(len(prompt) for prompt in prompts)
    steering, monitor = steering_and_monitor(info, fields, longest, sampling.max_tokens)
    now = time.time()
    return GenerateRequest(
        request_id=ID_PREFIX[endpoint] + uuid.uuid4().hex,
        endpoint=endpoint,
        model=info.name,
        prompt_token_ids=prompt_ids,
        sampling=sampling,
        created=int(now),
        n=fields.n,
        steering=steering,
        monitor=monitor,
        tenant=tenant,
        grammar=grammar,
        tool_parser=tools.parser,
        more_prompt_token_ids=list(more_prompt_ids),
        echo=fields.echoes_prompt,
        echo_from=echo_start(info.tokenizer, fields),
        prompt_logprobs=fields.prompt_logprobs,
        arrival_time=now,
        is_legacy_functions=getattr(fields, "functions", None) is not None,
    )


def generate(
    info: ModelInfo,
    endpoint: Endpoint,
    fields: GenerationFields,
    prompt_ids: list[int],
    body: dict,
    tools: ToolPlan = NO_TOOLS,
    more_prompt_ids: Sequence[list[int]] = (),
) -> Response:
    """Every prompt's choices are one request: one row, one stream, submitted to the engine together."""
    tenant = current_principal().tenant
    generate_request = build_generate_request(info, endpoint, fields, prompt_ids, tenant, tools, more_prompt_ids)
    if fields.stream:  # the worker writes each DELTA's chunks as the relay sends them
        meta = StreamMeta.of_body(generate_request.request_id, endpoint, info.name, generate_request.created, body)
        generate_request = dataclasses.replace(generate_request, stream_meta=meta)
    note_request_id(generate_request.request_id)
    record = record_and_enqueue(generate_request, body)
    return _stream(record) if fields.stream else _wait(record)


def record_and_enqueue(generate_request: GenerateRequest, body: dict) -> RequestRecord:
    sampling = generate_request.sampling
    num_tokens = generate_request.num_prompt_tokens + sampling.max_tokens * generate_request.num_choices
    record = RequestRecord(
        id=generate_request.request_id,
        tenant=generate_request.tenant,
        endpoint=generate_request.endpoint.value,
        model=generate_request.model,
        status=RequestStatus.QUEUED.value,
        body=body,
        prompt_tokens=generate_request.num_prompt_tokens,
        created=generate_request.created,
    )
    svc = services()
    return admit_and_enqueue(record, num_tokens, lambda: enqueue_generate(svc.celery, svc.config, generate_request))


def admit_and_enqueue(record: RequestRecord, num_tokens: int, enqueue: Callable[[], None]) -> RequestRecord:
    """Admits a request of `num_tokens` (429 otherwise), writes its row, then `enqueue`s its task; a task that could
    not be queued leaves the row ended with an error."""
    svc = services()
    session = db_session()
    # Redis down: admission's first step, the live-worker count, fails with a 503 before anything is written
    admit(session, svc.redis, svc.config, record.model, current_principal().key_name, num_tokens)
    create_request(session, record)
    logger.info("request %s from key %s (tenant %s)", record.id, current_principal().key_name, record.tenant)
    try:
        enqueue()
    except Exception:
        error = ErrorInfo("The request could not be queued.", "service_unavailable")
        record_result(session, record.id, text="", completion_tokens=0, finish_reason=None, error=error)
        raise
    release_admission_slot()  # enqueued: what is left (relaying, waiting) costs the api almost nothing
    return record


def cancel_generation(request_id: str) -> None:
    svc = services()
    with svc.sessions() as session:
        cancel_request(session, svc.redis, svc.config, request_id)


def request_frames(record: RequestRecord, after_id: str, on_timeout: Callable[[], None] | None = None) -> Iterator[str]:
    """The SSE frames of a request's stream after `after_id`; a quiet stream checks its worker is alive."""
    svc = services()
    return relay_frames(
        svc.streams.read_entries,
        RedisKeys(svc.config.redis_prefix).request_stream(record.id),
        StreamMeta.of(record),
        after_id,
        heartbeat_s=svc.config.sse_heartbeat_s,
        timeout_s=svc.config.request_timeout_s,
        on_timeout=on_timeout,
        on_idle=lambda: settle_quiet_request(svc.sessions, svc.redis, svc.config, record.id),
    )


def stream_response(record: RequestRecord, after_id: str, on_timeout: Callable[[], None] | None = None) -> Response:
    """The SSE relay of a request's stream after the frame `after_id`. While the request runs the relay holds an
    attachment, so a client that drops leaves the request running for STREAM_RESUME_GRACE_S to resume."""
    frames = request_frames(record, after_id, on_timeout)
    if record.is_finished:
        return sse_response(frames)
    svc = services()
    return resumable_response(frames, attach(svc.redis, svc.config, record.id))


def _stream(record: RequestRecord) -> Response:
    def cancel() -> None:
        logger.info("stream of %s timed out; cancelling it", record.id)
        cancel_generation(record.id)

    return stream_response(record, STREAM_START, on_timeout=cancel)


def _wait(record: RequestRecord) -> Response:
    return jsonify(completion_object(wait_for_finished(record), services().config.tool_call_parser))


def wait_for_finished(record: RequestRecord) -> RequestRecord:
    """The request once it has ended well; an APIError with its own error otherwise (504 when it timed out)."""
    svc = services()
    # A reader too, like a stream's relay: another client's dropped stream of this request must not cancel it.
    attachment = attach(svc.redis, svc.config, record.id)
    try:
        final = _wait_for_final(record, attachment)
    finally:
        attachment.detach()
    if final is None:
        cancel_generation(record.id)
        raise APIError(504, "The request timed out; it was cancelled.", type="timeout", code="timeout")
    session = db_session()
    session.expire_all()
    finished = get_request(session, record.id)
    if finished is None or finished.result is None:
        raise APIError(500, "The result was not recorded.", type="server_error")
    if finished.result.error is not None:
        error = ErrorInfo.from_dict(finished.result.error)
        status = error_status_code(error.type)
        raise APIError(status, error.message, type=error.type, param=error.param, code=error.code)
    return finished


def _wait_for_final(record: RequestRecord, attachment: StreamAttachment) -> StreamEvent | None:
    svc = services()

    def check_request() -> None:
        settle_quiet_request(svc.sessions, svc.redis, svc.config, record.id)

    def check_client() -> None:
        attachment.renew_if_due()
        if is_client_gone():  # nothing can resume a non-streamed answer: free the GPU now
            logger.info("client of %s hung up; cancelling it", record.id)
            cancel_generation(record.id)

    return wait_for_final(
        svc.streams.read_json,
        RedisKeys(svc.config.redis_prefix).request_stream(record.id),
        idle_s=svc.config.sse_heartbeat_s,
        timeout_s=svc.config.request_timeout_s,
        on_idle=check_request,
        on_tick=check_client,
    )
