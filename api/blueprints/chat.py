"""POST /v1/chat/completions"""

from __future__ import annotations

from flask import Blueprint, Response

from api.generation import check_model_name, generate, json_body
from api.prompts import chat_prompt_ids
from api.schemas import ChatCompletionRequest
from api.services import services
from api.tools import tool_plan
from tasks.messages import Endpoint

bp = Blueprint("chat", __name__)


@bp.post("/v1/chat/completions")
def create_chat_completion() -> Response:
    body = json_body()
    chat = ChatCompletionRequest.model_validate(body)
    check_model_name(chat.model)
    info = services().model_info
    tools = tool_plan(info.tokenizer, chat, info.tool_call_parser)
    prompt_ids = chat_prompt_ids(info.tokenizer, chat.messages, tools.template_tools, chat)
    return generate(Endpoint.CHAT, chat, prompt_ids, body, tools)
