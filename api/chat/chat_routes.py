"""POST /v1/chat/completions"""

from __future__ import annotations

from flask import Blueprint, Response

from api.chat.generation import generate
from api.chat.prompts import chat_prompt_ids
from api.chat.schemas import ChatCompletionRequest
from api.gate.request_limits import read_json_object
from api.services import model_info_for
from api.structured.tools import tool_plan
from tasks.messages.generation import Endpoint

bp = Blueprint("chat", __name__)


@bp.post("/v1/chat/completions")
def create_chat_completion() -> Response:
    body = read_json_object()
    chat = ChatCompletionRequest.model_validate(body)
    info = model_info_for(chat.model)
    tools = tool_plan(info.tokenizer, chat, info.tool_call_parser)
    prompt_ids = chat_prompt_ids(info.tokenizer, chat.messages, tools.template_tools, chat)
    return generate(info, Endpoint.CHAT, chat, prompt_ids, body, tools)
