"""A served model as the api knows it: its tokenizer files, context length and shape, read once without loading the
model."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from tasks.config import Config
from tasks.messages.tool_calls import PARSERS

logger = logging.getLogger(__name__)


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
    text_config = model_config.get("text_config") or model_config
    max_model_len = config.max_model_len or config_value(text_config, "max_position_embeddings")
    if not max_model_len:
        raise ValueError(f"{config.model}'s config.json names no context length: set MAX_MODEL_LEN")
    # what a prompt's characters are bounded by (api/chat/prompt_bounds.py)
    tokenizer.model_max_length = int(max_model_len)
    logger.info("tokenizer of %s loaded; max_model_len=%d", config.model, max_model_len)
    num_layers = config_value(text_config, "num_hidden_layers")
    return ModelInfo(
        name=config.model_name,
        max_model_len=int(max_model_len),
        tokenizer=tokenizer,
        hidden_size=config_value(text_config, "hidden_size"),
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


# What GPT-2-style config.json files call these (transformers maps them with each config class's attribute_map, but a
# config class imports torch, which the api never loads).
CONFIG_ALIASES = {"num_hidden_layers": "n_layer", "hidden_size": "n_embd", "max_position_embeddings": "n_positions"}


def config_value(text_config: dict, name: str) -> int:
    """A size from config.json under its usual name or its GPT-2-style alias; 0 when it has neither."""
    return int(text_config.get(name, text_config.get(CONFIG_ALIASES[name], 0)) or 0)


def _read_model_config(model: str) -> dict:
    if Path(model).is_dir():
        return json.loads((Path(model) / "config.json").read_text())
    from huggingface_hub import hf_hub_download

    return json.loads(Path(hf_hub_download(model, "config.json")).read_text())
