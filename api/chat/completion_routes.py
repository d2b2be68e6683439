"""POST /v1/completions"""

from __future__ import annotations

from flask import Blueprint, Response

from api.chat.generation import generate
from api.chat.prompts import completion_prompt_ids
from api.chat.schemas import CompletionRequest
from api.gate.request_limits import read_json_object
from api.services import model_info_for
from tasks.messages.generation import Endpoint

bp = Blueprint("completions", __name__)


@bp.post("/v1/completions")
def create_completion() -> Response:
    body = read_json_object()
    completion = CompletionRequest.model_validate(body)
    info = model_info_for(completion.model)
    first, *more = [
        completion_prompt_ids(info.tokenizer, prompt, completion.add_special_tokens) for prompt in completion.prompts
    ]
    return generate(info, Endpoint.COMPLETIONS, completion, first, body, more_prompt_ids=more)
