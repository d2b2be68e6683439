"""The request bodies of OpenAI's Conversations API, validated with pydantic; items are the Responses API's input
items (unknown fields inside them ignored, as there)."""

from __future__ import annotations

from typing import Annotated, get_args

from flask import request
from pydantic import Field

from api.errors import APIError
from api.responses.schemas import INCLUDABLE, InputItem, Metadata
from api.structured.schemas import StrictModel

MAX_ITEMS_PER_CALL = 20  # OpenAI's: "You may add up to 20 items at a time."


class ConversationCreateRequest(StrictModel):
    items: Annotated[list[InputItem] | None, Field(max_length=MAX_ITEMS_PER_CALL)] = None
    metadata: Metadata = None


class ConversationUpdateRequest(StrictModel):
    metadata: Metadata  # required, as OpenAI has it; null clears it


class ItemsCreateRequest(StrictModel):
    items: list[InputItem] = Field(min_length=1, max_length=MAX_ITEMS_PER_CALL)


def check_include() -> None:
    """`?include=` (repeated, or as `include[]`): OpenAI's includable fields are accepted and add nothing here (the
    stored output text carries its logprobs when its response asked for them); anything else is a 400."""
    allowed = get_args(INCLUDABLE)
    for value in request.args.getlist("include") + request.args.getlist("include[]"):
        if value not in allowed:
            raise APIError(400, f"include must be one of {', '.join(allowed)}.", param="include")
