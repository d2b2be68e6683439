"""What clients send by habit and the request bodies take as OpenAI and vLLM do: an explicit `null` for a field that
has a default (openai-python sends null whenever its caller passes None), and unknown fields inside messages and
input items given back from an earlier reply (openai's `model_dump()` adds `refusal`, `annotations`, `audio`;
litellm adds `provider_specific_fields`; reasoning models' histories carry `reasoning_content`). Unknown top-level
fields stay a 400 naming them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticUseDefault, core_schema


class ReplayedModel(BaseModel):
    """A message, content part or item a client may replay as it received it: unknown fields are ignored; the known
    ones keep StrictModel's strict JSON types."""

    model_config = ConfigDict(extra="ignore", strict=True)


def _null_is_default(value: Any) -> Any:
    if value is None:
        raise PydanticUseDefault()
    return value


class NullIsDefault:
    """`Annotated[float, NULL_IS_DEFAULT]`: an explicit null takes the field's default; the OpenAPI document lists
    null beside the field's own schema (its bounds kept)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_before_validator_function(_null_is_default, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"anyOf": [handler(schema), {"type": "null"}]}


NULL_IS_DEFAULT = NullIsDefault()
