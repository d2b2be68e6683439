"""POST /v1/embeddings: validate and tokenize every input, record the request, have a worker of the model embed them
(through Celery, on the model's interactive queue, as chat), wait for the stored vectors."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from api.chat.generation import admit_and_enqueue, wait_for_finished
from api.embeddings.embed_request import build_embed_request
from api.embeddings.schemas import EmbeddingRequest
from api.errors import APIError
from api.gate.auth import current_principal
from api.gate.request_ids import note_request_id
from api.gate.request_limits import read_json_object
from api.services import model_info_for, services
from tasks.celery_app import enqueue_embed
from tasks.messages.embeddings import EMBEDDINGS_ENDPOINT, embedding_answer
from tasks.store.models import RequestRecord, RequestStatus

bp = Blueprint("embeddings", __name__)


@bp.post("/v1/embeddings")
def create_embedding() -> Response:
    body = read_json_object()
    embedding = EmbeddingRequest.model_validate(body)
    info = model_info_for(embedding.model)
    embed_request = build_embed_request(info, embedding, current_principal().tenant)
    note_request_id(embed_request.request_id)
    svc = services()
    record = RequestRecord(
        id=embed_request.request_id,
        tenant=embed_request.tenant,
        endpoint=EMBEDDINGS_ENDPOINT,
        model=embed_request.model,
        status=RequestStatus.QUEUED.value,
        body=body,
        prompt_tokens=embed_request.num_prompt_tokens,
        created=embed_request.created,
    )
    num_tokens = embed_request.num_prompt_tokens
    admit_and_enqueue(record, num_tokens, lambda: enqueue_embed(svc.celery, svc.config, embed_request))
    finished = wait_for_finished(record)
    assert finished.result is not None  # wait_for_finished raises for a request without a result or with an error
    if not finished.result.text:
        raise APIError(409, "The request was cancelled before it ran.", code="request_cancelled")
    return jsonify(embedding_answer(embed_request, finished.result.text))
