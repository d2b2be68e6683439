"""A request's output constraint as the api hands it to the worker: what kind of grammar, its source text, and the
request field it came from (so a compile failure in the worker still names the `param` to fix)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any


class GrammarKind(str, Enum):
    JSON_SCHEMA = "json_schema"  # value: the schema as JSON text
    JSON_OBJECT = "json_object"  # value: "" (any JSON object)
    REGEX = "regex"  # value: the pattern
    CHOICE = "choice"  # value: a JSON list of the allowed strings
    GRAMMAR = "grammar"  # value: an EBNF grammar (GBNF dialect, `root ::= ...`)
    TOOL_CALLS = "tool_calls"  # value: ToolCallGrammar as JSON text


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    value: str
    param: str  # the request field that set it, e.g. "response_format.json_schema.schema"

    @property
    def key(self) -> str:
        """What the worker caches a compiled grammar by: equal specs compile to equal grammars, whatever field
        they came from."""
        return hashlib.sha256(f"{self.kind.value}\0{self.value}".encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "value": self.value, "param": self.param}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GrammarSpec:
        return cls(GrammarKind(data["kind"]), data["value"], data["param"])


@dataclass(frozen=True)
class ToolFunction:
    name: str
    parameters: dict[str, Any]  # a JSON schema for the arguments object

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "parameters": self.parameters}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolFunction:
        return cls(data["name"], data["parameters"])


@dataclass(frozen=True)
class ToolCallGrammar:
    """Calls written in `parser`'s format: calls the model must make (tool_choice "required" or a named function),
    or, triggered (tool_choice "auto"), free text in which each call the model starts (the parser's start marker) must
    go on as a whole call to an offered function."""

    parser: str  # a TOOL_CALL_PARSER name: the format the calls are written in
    functions: tuple[ToolFunction, ...]  # the functions a call may name
    is_parallel: bool  # one or more calls; else exactly one (triggered: at most one)
    is_triggered: bool = False
    is_named: bool = False  # tool_choice named the function: the reply finishes "stop", as OpenAI's does

    def to_spec(self, param: str) -> GrammarSpec:
        functions = [function.to_dict() for function in self.functions]
        value = {"parser": self.parser, "functions": functions, "parallel": self.is_parallel}
        value |= {"triggered": self.is_triggered, "named": self.is_named}
        return GrammarSpec(GrammarKind.TOOL_CALLS, json.dumps(value, sort_keys=True), param)

    @classmethod
    def from_spec(cls, spec: GrammarSpec) -> ToolCallGrammar:
        value = json.loads(spec.value)
        functions = tuple(ToolFunction.from_dict(f) for f in value["functions"])
        return cls(value["parser"], functions, bool(value["parallel"]), bool(value["triggered"]), bool(value["named"]))

    @classmethod
    def is_named_in(cls, spec: GrammarSpec | None) -> bool:
        """Whether `spec` forces a call to one named function."""
        return spec is not None and spec.kind == GrammarKind.TOOL_CALLS and cls.from_spec(spec).is_named
