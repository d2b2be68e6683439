"""Tokenizer files and prompt building: chat templates and token counts, without loading the model."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

from api.errors import APIError
from api.openai_extras import ChatTemplateFields
from api.prompt_bounds import check_prompt_chars
from api.schemas import ChatMessage
from tasks.config import Config
from tasks.tool_calls import PARSERS

logger = logging.getLogger(__name__)
PLAIN_TEMPLATE = ChatTemplateFields()  # a new assistant turn, no extra variables


@dataclass(frozen=True)
class ModelInfo:
    name: str
    max_model_len: int
    tokenizer: PreTrainedTokenizerFast
    hidden_size: int = 0  # what a raw steering vector's length must be; 0: unknown
    num_layers: int = 0  # decoder layers a steering vector can name; 0: unknown
    speculative_methods: frozenset[str] = frozenset({"ngram", "none"})  # what a request's `speculative` may name
    tool_call_parser: str = "hermes"  # the format the model writes tool calls in (the workers share this Config)


def load_models(config: Config) -> dict[str, ModelInfo]:
    """Every served model's info by name (`SERVED_MODELS`), the default one first, each loaded once."""
    return {name: load_model_info(config.for_model(name)) for name in config.served_model_paths()}


def load_model_info(config: Config) -> ModelInfo:
    if config.tool_call_parser not in PARSERS:
        raise ValueError(f"TOOL_CALL_PARSER={config.tool_call_parser!r}: use one of {', '.join(PARSERS)}")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(config.model)
    model_config = _read_model_config(config.model)
    max_model_len = config.max_model_len or model_config["max_position_embeddings"]
    tokenizer.model_max_length = int(max_model_len)  # what a prompt's characters are bounded by (api/prompt_bounds.py)
    logger.info("tokenizer of %s loaded; max_model_len=%d", config.model, max_model_len)
    text_config = model_config.get("text_config") or model_config
    num_layers = int(text_config.get("num_hidden_layers", 0))
    return ModelInfo(
        name=config.model_name,
        max_model_len=int(max_model_len),
        tokenizer=tokenizer,
        hidden_size=int(text_config.get("hidden_size", 0)),
        num_layers=num_layers,
        speculative_methods=_speculative_methods(config, num_layers),
        tool_call_parser=config.tool_call_parser,
    )


def _speculative_methods(config: Config, num_layers: int) -> frozenset[str]:
    """A self-draft needs a layer to leave out; a draft model, one configured (the workers share this Config)."""
    methods = {"ngram", "none"}
    if config.self_draft_layers(num_layers) is not None:
        methods.add("self")
    if config.speculative_draft_model:
        methods.add("draft")
    return frozenset(methods)


def _read_model_config(model: str) -> dict:
    if Path(model).is_dir():
        return json.loads((Path(model) / "config.json").read_text())
    from huggingface_hub import hf_hub_download

    return json.loads(Path(hf_hub_download(model, "config.json")).read_text())


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
    tokenizer: PreTrainedTokenizerFast, prompt: str | list[int], add_special_tokens: bool = True
) -> list[int]:
    if isinstance(prompt, str):
        check_prompt_chars(tokenizer, prompt, "prompt")
        return tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
    vocab_size = len(tokenizer)
    if any(not 0 <= token < vocab_size for token in prompt):
        raise APIError(400, f"prompt token ids must lie in [0, {vocab_size})", param="prompt")
    return list(prompt)


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
