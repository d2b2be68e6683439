"""POST /v1/completions"""

from __future__ import annotations

from flask import Blueprint, Response

from api.generation import check_model_name, generate, json_body
from api.prompts import completion_prompt_ids
from api.schemas import CompletionRequest
from api.services import services
from tasks.messages import Endpoint

bp = Blueprint("completions", __name__)


@bp.post("/v1/completions")
def create_completion() -> Response:
    body = json_body()
    completion = CompletionRequest.model_validate(body)
    check_model_name(completion.model)
    tokenizer = services().model_info.tokenizer
    first, *more = [completion_prompt_ids(tokenizer, prompt) for prompt in completion.prompts]
    return generate(Endpoint.COMPLETIONS, completion, first, body, more_prompt_ids=more)
