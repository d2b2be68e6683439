"""POST /tokenize and POST /detokenize, in vLLM's shapes: the prompt a request would send the model, and back."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from pydantic import Field

from api.chat.openai_extras import ChatTemplateFields
from api.chat.prompts import chat_prompt_ids, completion_prompt_ids
from api.chat.schemas import ChatMessage
from api.errors import APIError
from api.gate.request_limits import read_json_object
from api.models.model_info import ModelInfo
from api.services import model_info_for, services
from api.structured.schemas import StrictModel

bp = Blueprint("tokenize", __name__)
MAX_DETOKENIZE_TOKENS = 1_000_000  # beyond any context; bounds the work of one call


class PromptTokenize(StrictModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class ChatTokenize(ChatTemplateFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    return_token_strs: bool = False


class Detokenize(StrictModel):
    model: str | None = None
    tokens: list[int] = Field(max_length=MAX_DETOKENIZE_TOKENS)


@bp.post("/tokenize")
def tokenize() -> Response:
    """`prompt` as /v1/completions tokenizes it, or `messages` as /v1/chat/completions renders and tokenizes them."""
    body = read_json_object()
    request = ChatTokenize.model_validate(body) if "messages" in body else PromptTokenize.model_validate(body)
    info = _served_model(request.model)
    if isinstance(request, ChatTokenize):
        token_ids = chat_prompt_ids(info.tokenizer, request.messages, template=request)
    else:
        token_ids = completion_prompt_ids(info.tokenizer, request.prompt, request.add_special_tokens)
    token_strs = info.tokenizer.convert_ids_to_tokens(token_ids) if request.return_token_strs else None
    return jsonify(
        {"count": len(token_ids), "max_model_len": info.max_model_len, "tokens": token_ids, "token_strs": token_strs}
    )


@bp.post("/detokenize")
def detokenize() -> Response:
    request = Detokenize.model_validate(read_json_object())
    tokenizer = _served_model(request.model).tokenizer
    vocab_size = len(tokenizer)
    if any(not 0 <= token < vocab_size for token in request.tokens):
        raise APIError(400, f"tokens must lie in [0, {vocab_size})", param="tokens")
    return jsonify({"prompt": tokenizer.decode(request.tokens)})


def _served_model(name: str | None) -> ModelInfo:
    """vLLM's tokenize and detokenize take the (default) served model when none is named."""
    return services().model_info if name is None else model_info_for(name)
