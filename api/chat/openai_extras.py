"""Fields OpenAI's SDKs and vLLM's clients send by default, each recorded, honoured or ignored on purpose (the README's
request-field table says which): a client's defaults never become a 400."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from api.structured.schemas import StrictModel

MAX_METADATA_PAIRS = 16  # OpenAI's limits on `metadata`
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_IDENTIFIER_CHARS = 256  # user, prompt_cache_key, safety_identifier, request_id
MAX_TEMPLATE_KWARGS = 32
MAX_TEMPLATE_KWARGS_CHARS = 16_384  # all of chat_template_kwargs, as JSON
TEMPLATE_KWARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# What the render itself passes (or transformers keeps for itself): a kwarg may not replace them.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message",
     "tokenize", "return_dict", "return_tensors", "chat_template", "tokenizer", "bos_token", "eos_token"}
)  # fmt: skip

Identifier = Annotated[str, StringConstraints(max_length=MAX_IDENTIFIER_CHARS, pattern=r"^[\x20-\x7e]*$")]
MetadataKey = Annotated[str, StringConstraints(max_length=MAX_METADATA_KEY_CHARS)]
MetadataValue = Annotated[str, StringConstraints(max_length=MAX_METADATA_VALUE_CHARS)]


class PredictionPart(StrictModel):
    type: Literal["text"]
    text: str


class PredictionBody(StrictModel):
    """OpenAI's Predicted Outputs: accepted, and not used (speculation proposes from the prompt and output)."""

    type: Literal["content"]
    content: str | list[PredictionPart]


class OpenAIExtras(StrictModel):
    """OpenAI's fields that change nothing here: recorded with the request (its stored body) or ignored."""

    store: bool | None = None  # every request is stored (GET /v1/requests/{id}) whatever it says
    metadata: dict[MetadataKey, MetadataValue] | None = Field(None, max_length=MAX_METADATA_PAIRS)
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None  # answered as "default"
    prompt_cache_key: Identifier | None = None  # prefix caching is automatic, by the prompt's tokens
    safety_identifier: Identifier | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None  # the models do not reason
    verbosity: Literal["low", "medium", "high"] | None = None
    prediction: PredictionBody | None = None
    modalities: list[Literal["text"]] | None = None  # text is the only output there is


class DetokenizeFields(StrictModel):
    """vLLM's detokenization fields, on chat and completions alike."""

    skip_special_tokens: bool = True  # False: special tokens (the chat template's headers) appear in the text
    spaces_between_special_tokens: bool = True  # a fast tokenizer's decoder joins tokens itself, as in vLLM
    include_stop_str_in_output: bool = False  # the stop string (or stop token's text) ends the output
    request_id: Identifier | None = None  # recorded with the request; its id stays the server's own


class ChatTemplateFields(StrictModel):
    """vLLM's chat template controls: whether the prompt opens the assistant's turn or continues the last message,
    and extra variables for the template."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _check_template_kwargs(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        if not kwargs:
            return kwargs
        if len(kwargs) > MAX_TEMPLATE_KWARGS:
            raise ValueError(f"at most {MAX_TEMPLATE_KWARGS} chat_template_kwargs are allowed")
        for name in kwargs:
            if not TEMPLATE_KWARG_NAME.match(name):
                raise ValueError(f"{name[:64]!r} is not a template variable name")
            if name in RESERVED_TEMPLATE_KWARGS:
                raise ValueError(f"{name!r} is set by the request itself, not by chat_template_kwargs")
        if len(json.dumps(kwargs)) > MAX_TEMPLATE_KWARGS_CHARS:
            raise ValueError(f"chat_template_kwargs are longer than {MAX_TEMPLATE_KWARGS_CHARS} characters")
        return kwargs

    @model_validator(mode="after")
    def _one_ending(self) -> ChatTemplateFields:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message needs add_generation_prompt set to false")
        return self
