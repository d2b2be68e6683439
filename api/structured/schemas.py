"""Request fields for structured outputs and tools: OpenAI's `response_format`, `tools`, `tool_choice` and legacy
`functions`, and vLLM's `structured_outputs` and `guided_*`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from api.gate.lenient_fields import ReplayedModel

FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function names
MAX_TOOLS = 128


class StrictModel(BaseModel):
    """Unknown fields are refused, and values are taken only as the JSON type the OpenAPI document gives them (as
    OpenAI does): `"logprobs": 0`, `"n": true` or `"temperature": "1"` is a 400, never silently coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TextFormat(StrictModel):
    type: Literal["text"]


class JsonObjectFormat(StrictModel):
    type: Literal["json_object"]


class JsonSchemaBody(StrictModel):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    json_schema: dict[str, Any] | bool = Field(True, alias="schema")  # OpenAI's default: any JSON
    strict: bool | None = None  # the grammar always enforces the schema, strict or not


class JsonSchemaFormat(StrictModel):
    type: Literal["json_schema"]
    json_schema: JsonSchemaBody


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class StructuredOutputsBody(StrictModel):
    """vLLM's `structured_outputs`: exactly one of its constraints."""

    json_value: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = None
    json_object: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputsBody:
        given = [self.json_value, self.regex, self.choice, self.grammar, self.json_object or None]
        if sum(value is not None for value in given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar, json_object")
        return self


class FunctionDefinition(StrictModel):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None  # forced calls always follow `parameters`


class ToolBody(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: FunctionName


class AllowedTool(StrictModel):
    type: Literal["function"]
    function: FunctionName


class AllowedToolsBody(StrictModel):
    """The tools the model may call, of those offered (all stay shown to it): freely ("auto") or one at least."""

    mode: Literal["auto", "required"]
    tools: list[AllowedTool] = Field(min_length=1, max_length=MAX_TOOLS)


class AllowedToolsChoice(StrictModel):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedToolsBody


TOOL_CHOICES = ("none", "auto", "required")
FUNCTION_CALLS = ("none", "auto")


class ToolCallFunction(ReplayedModel):
    name: str
    arguments: str  # a JSON text, as the API returned it


class ToolCallBody(ReplayedModel):
    """A call in an assistant message of the history (as replayed: unknown fields are ignored)."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class StructuredFields(StrictModel):
    """vLLM's constraint fields, on chat and completions alike."""

    structured_outputs: StructuredOutputsBody | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: str | None = None


class ToolFields(StrictModel):
    """Chat's output format and tools."""

    response_format: ResponseFormat | None = None
    tools: list[ToolBody] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: str | NamedToolChoice | AllowedToolsChoice | None = None  # one of TOOL_CHOICES, a function, a subset
    parallel_tool_calls: bool | None = None
    functions: list[FunctionDefinition] | None = Field(None, max_length=MAX_TOOLS)  # legacy: tools
    function_call: str | FunctionName | None = None  # legacy: tool_choice, one of FUNCTION_CALLS or a function

    # Checked here rather than as Literal members of the union, so that an error names the field alone.
    @field_validator("tool_choice")
    @classmethod
    def _check_tool_choice(
        cls, choice: str | NamedToolChoice | AllowedToolsChoice | None
    ) -> str | NamedToolChoice | AllowedToolsChoice | None:
        if isinstance(choice, str) and choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or a named function")
        return choice

    @field_validator("function_call")
    @classmethod
    def _check_function_call(cls, call: str | FunctionName | None) -> str | FunctionName | None:
        if isinstance(call, str) and call not in FUNCTION_CALLS:
            raise ValueError(f"function_call must be one of {', '.join(FUNCTION_CALLS)} or a named function")
        return call
