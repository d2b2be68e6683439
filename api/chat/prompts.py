"""Prompt building: chat templates and token counts with the served model's tokenizer, without loading the model."""

from __future__ import annotations

import json
from typing import Any

from transformers import PreTrainedTokenizerFast

from api.chat.openai_extras import ChatTemplateFields
from api.chat.prompt_bounds import check_prompt_chars
from api.chat.schemas import ChatMessage, CompletionRequest, GenerationFields
from api.errors import APIError
from api.models.model_info import ModelInfo

PLAIN_TEMPLATE = ChatTemplateFields()  # a new assistant turn, no extra variables


def chat_prompt_ids(
    tokenizer: PreTrainedTokenizerFast,
    messages: list[ChatMessage],
    tools: list[dict[str, Any]] | None = None,
    template: ChatTemplateFields = PLAIN_TEMPLATE,
) -> list[int]:
    """The prompt the model's chat template makes of `messages`, with `tools` offered (HF's `tools=` argument):
    opening the assistant's turn, or continuing the final message, with the request's extra template variables."""
    if not tokenizer.chat_template:
        raise APIError(400, "This model has no chat template; use /v1/completions.", param="messages")
    conversation = [_template_message(m) for m in messages]
    try:
        text = tokenizer.apply_chat_template(
            conversation,
            tools=tools,
            add_generation_prompt=template.add_generation_prompt,
            continue_final_message=template.continue_final_message,
            tokenize=False,
            **(template.chat_template_kwargs or {}),
        )
    except Exception as exc:  # the template's own raise_exception() tells the user what it expects
        raise APIError(400, f"The chat template rejected the messages: {exc}", param="messages") from exc
    check_prompt_chars(tokenizer, text, "messages")
    return tokenizer.encode(text, add_special_tokens=False)


def _template_message(message: ChatMessage) -> dict[str, Any]:
    """A message as chat templates take it: a call's arguments as an object (templates write them with tojson)."""
    rendered: dict[str, Any] = {"role": message.role, "content": message.text}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                             "arguments": _arguments(call.function.arguments)}}
            for call in message.tool_calls
        ]  # fmt: skip
    if message.tool_call_id:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON: the template shows it as it came


def completion_prompt_ids(
    tokenizer: PreTrainedTokenizerFast, prompt: str | list[int], add_special_tokens: bool = True, param: str = "prompt"
) -> list[int]:
    """A text or token-id prompt's ids; a 400 naming `param` for token ids outside the vocabulary."""
    if isinstance(prompt, str):
        check_prompt_chars(tokenizer, prompt, param)
        return tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    vocab_size = len(tokenizer)
    if any(not 0 <= token < vocab_size for token in prompt):
        raise APIError(400, f"{param} token ids must lie in [0, {vocab_size})", param=param)
    return list(prompt)


def echo_start(tokenizer: PreTrainedTokenizerFast, fields: GenerationFields) -> int:
    """Where an echo starts in each prompt: after the special tokens (a BOS) the tokenizer added to a text prompt,
    which the client never sent; token-id prompts are echoed whole."""
    is_text = isinstance(fields, CompletionRequest) and isinstance(fields.prompts[0], str)
    if not (fields.echoes_prompt and is_text and fields.add_special_tokens):
        return 0
    plain = tokenizer.encode("x", add_special_tokens=False)
    marked = tokenizer.encode("x")
    return next(start for start in range(len(marked)) if marked[start : start + len(plain)] == plain)


def resolve_max_tokens(info: ModelInfo, num_prompt_tokens: int, requested: int | None) -> int:
    """The completion budget; like vLLM, the rest of the context when the client names none."""
    available = info.max_model_len - num_prompt_tokens
    if available < 1 or (requested is not None and requested > available):
        asked = 1 if requested is None else requested
        raise APIError(
            400,
            f"This model's maximum context length is {info.max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + asked} tokens ({num_prompt_tokens} in the prompt, {asked} for the completion).",
            param="messages" if requested is None else "max_tokens",
            code="context_length_exceeded",
        )
    return available if requested is None else requested
