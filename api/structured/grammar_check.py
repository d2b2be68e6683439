"""Grammars checked at the api, before anything is recorded or queued, so a bad schema, regex or grammar is a 400
that names its field.

The worker compiles with xgrammar, which imports torch; the api never does (DESIGN.md rule 4). So the api compiles
each grammar with llguidance, a Rust library with no torch, against the model's own tokenizer. The two libraries
read JSON Schema, regexes and GBNF grammars alike for what clients send; what only xgrammar refuses still comes
back as the request's invalid_request_error (a 400 when not streamed) with the same `param`.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import llguidance
import llguidance.hf
from transformers import PreTrainedTokenizerFast

from api.errors import APIError
from tasks.messages.grammar import GrammarKind, GrammarSpec

_tokenizers: dict[int, llguidance.LLTokenizer] = {}
_tokenizers_lock = threading.Lock()


def check_grammar(tokenizer: PreTrainedTokenizerFast, spec: GrammarSpec) -> None:
    """Raises APIError 400 (param: the spec's field) when the grammar does not compile. Tool-call grammars are
    made of the tools' parameter schemas, which `check_json_schema` checks where the tools are read."""
    if spec.kind == GrammarKind.JSON_SCHEMA:
        check_json_schema(tokenizer, json.loads(spec.value), spec.param)
    elif spec.kind == GrammarKind.REGEX:
        _check(tokenizer, spec.param, lambda: llguidance.grammar_from("regex", spec.value))
    elif spec.kind == GrammarKind.GRAMMAR:
        _check(tokenizer, spec.param, lambda: llguidance.grammar_from("grammar", spec.value))


def check_json_schema(tokenizer: PreTrainedTokenizerFast, schema: dict[str, Any], param: str) -> None:
    # lenient: keywords neither library enforces (formats, annotations) are ignored, as xgrammar ignores them
    _check(tokenizer, param, lambda: llguidance.LLMatcher.grammar_from_json_schema(schema, {"lenient": True}))


def _check(tokenizer: PreTrainedTokenizerFast, param: str, build: Any) -> None:
    try:
        grammar = build()
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, _ll_tokenizer(tokenizer))
        error = messages[0] if is_error else ""
    except ValueError as exc:  # a grammar that does not even convert (an undefined GBNF rule)
        error = str(exc)
    if error:
        raise APIError(400, f"{param} does not compile: {error.strip()}", param=param, code="invalid_grammar")
    if not _can_start(tokenizer, grammar):
        message = f"{param} can never be matched: no text satisfies it"
        raise APIError(400, message, param=param, code="invalid_grammar")


def _can_start(tokenizer: PreTrainedTokenizerFast, grammar: str) -> bool:
    """False when not even a first token can be written: the grammar compiles but matches nothing (a `$ref` or rule
    that refers only to itself, a class like `[^\\s\\S]`). The engine would mask every token of its row."""
    matcher = llguidance.LLMatcher(_ll_tokenizer(tokenizer), grammar)
    matcher.compute_bitmask()  # sets the matcher's error when no token extends the text
    return not matcher.is_error()


def _ll_tokenizer(tokenizer: PreTrainedTokenizerFast) -> llguidance.LLTokenizer:
    """Built once per tokenizer (about a second for a large vocabulary); the api holds one for its life."""
    with _tokenizers_lock:
        found = _tokenizers.get(id(tokenizer))
        if found is None:
            found = _tokenizers[id(tokenizer)] = llguidance.hf.from_tokenizer(tokenizer)
        return found
