"""The output constraint a request's structured-output fields ask for, as the worker's GrammarSpec: OpenAI's
`response_format` and vLLM's `structured_outputs` and `guided_*`; at most one of them may be given."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from transformers import PreTrainedTokenizerFast

from api.chat.schemas import GenerationFields
from api.errors import APIError
from api.structured.grammar_check import check_grammar
from api.structured.schemas import JsonObjectFormat, JsonSchemaFormat, StructuredOutputsBody
from tasks.messages.grammar import GrammarKind, GrammarSpec, ToolCallGrammar


def request_grammar(
    tokenizer: PreTrainedTokenizerFast, fields: GenerationFields, tool_grammar: GrammarSpec | None
) -> GrammarSpec | None:
    """The grammar every token of the request obeys, compiled once here so a bad one is a 400 before queueing."""
    grammar = structured_grammar(fields)
    if tool_grammar is not None and ToolCallGrammar.from_spec(tool_grammar).is_triggered:
        # tool_choice "auto": alone, the reply is free text that may end anywhere outside a call, so min_tokens and
        # ignore_eos go with it (tool_plan checked the tools' schemas); another constraint holds the whole reply
        if grammar is None:
            return tool_grammar
        tool_grammar = None
    if grammar is not None and tool_grammar is not None:
        message = f"{tool_grammar.param} forces tool calls, which cannot be combined with {grammar.param}"
        raise APIError(400, message, param=tool_grammar.param)
    grammar = grammar or tool_grammar
    if grammar is None:
        return None
    # The grammar decides when the reply may end: it cannot also be made to go on.
    if fields.min_tokens:
        raise APIError(400, f"min_tokens cannot be combined with {grammar.param}", param="min_tokens")
    if fields.ignore_eos:
        raise APIError(400, f"ignore_eos cannot be combined with {grammar.param}", param="ignore_eos")
    check_grammar(tokenizer, grammar)
    return grammar


def structured_grammar(fields: GenerationFields) -> GrammarSpec | None:
    """The request's one constraint, or None; a 400 naming the second field when two are given."""
    specs = list(_requested(fields))
    if len(specs) > 1:
        message = f"{specs[1].param} cannot be combined with {specs[0].param}: give one output constraint"
        raise APIError(400, message, param=specs[1].param)
    return specs[0] if specs else None


def json_schema_spec(schema: dict[str, Any] | str | bool, param: str) -> GrammarSpec:
    """A JSON schema, given as an object or as JSON text (vLLM allows both); key order is kept, since it is the
    order the properties are generated in."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise APIError(400, f"{param} is not valid JSON: {exc}", param=param, code="invalid_json_schema") from exc
    if schema is True:
        schema = {}  # any JSON value
    if not isinstance(schema, dict):
        raise APIError(400, f"{param} must be a JSON schema object", param=param, code="invalid_json_schema")
    return GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema), param)


def _requested(fields: GenerationFields) -> Iterator[GrammarSpec]:
    response_format = getattr(fields, "response_format", None)  # chat only; "text" asks for nothing
    if isinstance(response_format, JsonObjectFormat):
        yield GrammarSpec(GrammarKind.JSON_OBJECT, "", "response_format")
    elif isinstance(response_format, JsonSchemaFormat):
        yield json_schema_spec(response_format.json_schema.json_schema, "response_format.json_schema.schema")
    if fields.structured_outputs is not None:
        yield _structured_outputs(fields.structured_outputs)
    if fields.guided_json is not None:
        yield json_schema_spec(fields.guided_json, "guided_json")
    if fields.guided_regex is not None:
        yield GrammarSpec(GrammarKind.REGEX, fields.guided_regex, "guided_regex")
    if fields.guided_choice is not None:
        yield GrammarSpec(GrammarKind.CHOICE, json.dumps(fields.guided_choice), "guided_choice")
    if fields.guided_grammar is not None:
        yield GrammarSpec(GrammarKind.GRAMMAR, fields.guided_grammar, "guided_grammar")


def _structured_outputs(body: StructuredOutputsBody) -> GrammarSpec:
    if body.json_value is not None:
        return json_schema_spec(body.json_value, "structured_outputs.json")
    if body.regex is not None:
        return GrammarSpec(GrammarKind.REGEX, body.regex, "structured_outputs.regex")
    if body.choice is not None:
        return GrammarSpec(GrammarKind.CHOICE, json.dumps(body.choice), "structured_outputs.choice")
    if body.grammar is not None:
        return GrammarSpec(GrammarKind.GRAMMAR, body.grammar, "structured_outputs.grammar")
    return GrammarSpec(GrammarKind.JSON_OBJECT, "", "structured_outputs.json_object")
