"""A GrammarSpec as xgrammar compiles it: JSON schemas without free whitespace (a small model left free to write
whitespace may write nothing else), choices as an EBNF of literals, tool calls as a structural tag in the
parser's format."""

from __future__ import annotations

import json

import xgrammar as xgr
from xgrammar.structural_tag import (
    JSONSchemaFormat,
    StructuralTag,
    TagFormat,
    TagsWithSeparatorFormat,
    TriggeredTagsFormat,
)

from tasks.messages.grammar import GrammarKind, GrammarSpec, ToolCallGrammar
from tasks.messages.tool_calls import HERMES, HERMES_OPEN, LLAMA3_JSON

ANY_OBJECT = '{"type": "object"}'
# parser: (a call's text up to its name, from its name to its arguments, after its arguments, between calls)
CALL_FORMATS = {
    HERMES: ('<tool_call>\n{"name": "', '", "arguments": ', "}\n</tool_call>", "\n"),
    LLAMA3_JSON: ('{"name": "', '", "parameters": ', "}", "; "),
}
# What starts a call in free text (tool_choice "auto"): the parser's own start marker
CALL_TRIGGERS = {HERMES: HERMES_OPEN, LLAMA3_JSON: '{"name": "'}


def compile_spec(compiler: xgr.GrammarCompiler, spec: GrammarSpec) -> xgr.CompiledGrammar:
    """Raises whatever xgrammar raises for a grammar it cannot compile (RuntimeError, ValueError)."""
    if spec.kind == GrammarKind.JSON_SCHEMA:
        return compiler.compile_json_schema(spec.value, any_whitespace=False)
    if spec.kind == GrammarKind.JSON_OBJECT:  # any object: properties the schema does not name are allowed
        return compiler.compile_json_schema(ANY_OBJECT, any_whitespace=False, strict_mode=False)
    if spec.kind == GrammarKind.REGEX:
        return compiler.compile_regex(spec.value)
    if spec.kind == GrammarKind.CHOICE:
        return compiler.compile_grammar(choice_ebnf(json.loads(spec.value)))
    if spec.kind == GrammarKind.GRAMMAR:
        return compiler.compile_grammar(spec.value)
    return compiler.compile_structural_tag(tool_calls_tag(ToolCallGrammar.from_spec(spec)))


def can_start(compiled: xgr.CompiledGrammar) -> bool:
    """False when the grammar allows not even a first token (a `$ref` or rule that refers only to itself, an empty
    character class): a row under it would have every token masked."""
    bitmask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
    xgr.GrammarMatcher(compiled).fill_next_token_bitmask(bitmask)
    return bool(bitmask.any())


def choice_ebnf(choices: list[str]) -> str:
    """Exactly one of `choices`; JSON string escapes are EBNF's."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)


def tool_calls_tag(calls: ToolCallGrammar) -> StructuralTag:
    """One call (or, parallel, one or more) to the offered functions, each with arguments valid for its schema;
    triggered, any text, in which each call started goes on as such a call (the end marker may sit inside an argument
    string: the call ends only where its object does)."""
    name_prefix, arguments_prefix, suffix, separator = CALL_FORMATS[calls.parser]
    tags = [
        TagFormat(
            begin=name_prefix + function.name + arguments_prefix,
            content=JSONSchemaFormat(json_schema=function.parameters, max_whitespace_cnt=1),
            end=suffix,
        )
        for function in calls.functions
    ]
    if calls.is_triggered:
        trigger = CALL_TRIGGERS[calls.parser]
        triggered = TriggeredTagsFormat(triggers=[trigger], tags=tags, stop_after_first=not calls.is_parallel)
        return StructuralTag(format=triggered)
    calls_format = TagsWithSeparatorFormat(
        tags=tags, separator=separator, at_least_one=True, stop_after_first=not calls.is_parallel
    )
    return StructuralTag(format=calls_format)
