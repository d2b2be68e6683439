"""A chat request's tools: what the chat template is shown, whether the reply is parsed for calls, and the grammar
that holds calls to the offered tools: forced (tool_choice "required" or a named function), or, in "auto", each call
the model starts. Legacy `functions` / `function_call` map onto
`tools` / `tool_choice`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerFast

from api.chat.schemas import ChatCompletionRequest
from api.errors import APIError
from api.structured.grammar_check import check_json_schema
from api.structured.schemas import (
    AllowedToolsBody,
    AllowedToolsChoice,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
)
from tasks.messages.grammar import GrammarSpec, ToolCallGrammar, ToolFunction

NO_ARGUMENTS = {"type": "object", "properties": {}}  # a function given no `parameters` takes none


@dataclass(frozen=True)
class ToolPlan:
    template_tools: list[dict[str, Any]] | None  # the `tools` argument of the chat template
    parser: str | None  # the reply is parsed for calls in this format
    grammar: GrammarSpec | None  # calls the reply must make, or (auto) that each call it starts must be


NO_TOOLS = ToolPlan(None, None, None)


def tool_plan(tokenizer: PreTrainedTokenizerFast, chat: ChatCompletionRequest, parser: str) -> ToolPlan:
    """Raises APIError 400 (with `param`) for a tool_choice naming no offered function, or a parameters schema
    that does not compile."""
    functions, choice, param = _offered(chat)
    for index, function in enumerate(functions):
        if function.parameters is not None:
            where = f"{param}.{index}.function.parameters" if param == "tools" else f"{param}.{index}.parameters"
            check_json_schema(tokenizer, function.parameters, where)
    choice_param = "tool_choice" if param == "tools" else "function_call"
    if not functions:
        if choice not in (None, "none", "auto"):
            raise APIError(400, f"{choice_param} needs {param} to choose from", param=choice_param)
        return NO_TOOLS
    if choice == "none":
        return NO_TOOLS  # the model is not shown the tools, so it does not try to call them
    template_tools = [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in functions]
    callable_functions = functions
    if isinstance(choice, AllowedToolsBody):
        names = [tool.function.name for tool in choice.tools]
        callable_functions = [_named(functions, name, f"{choice_param}.allowed_tools.tools") for name in names]
        choice = choice.mode
    is_auto = choice in (None, "auto")
    forced = callable_functions if is_auto or choice == "required" else [_named(functions, choice.name, choice_param)]
    # a legacy `functions` reply has one `function_call`; tool_choice "required" or "auto" may make several calls
    is_parallel = param == "tools" and not isinstance(choice, FunctionName) and chat.parallel_tool_calls is not False
    choices = tuple(ToolFunction(f.name, f.parameters or NO_ARGUMENTS) for f in forced)
    is_named = isinstance(choice, FunctionName)
    calls = ToolCallGrammar(parser, choices, is_parallel, is_triggered=is_auto, is_named=is_named)
    return ToolPlan(template_tools, parser, calls.to_spec(choice_param))


def _offered(chat: ChatCompletionRequest) -> tuple[list[FunctionDefinition], Any, str]:
    """(functions, tool choice, the field they came from), from `tools` or the legacy `functions`."""
    if chat.functions is not None:
        if chat.tools is not None:
            raise APIError(400, "give tools or the legacy functions, not both", param="functions")
        if chat.tool_choice is not None:
            raise APIError(400, "tool_choice goes with tools; functions take function_call", param="tool_choice")
        return chat.functions, chat.function_call, "functions"
    if chat.function_call is not None:
        message = "function_call goes with the legacy functions; tools take tool_choice"
        raise APIError(400, message, param="function_call")
    choice: Any = chat.tool_choice
    if isinstance(choice, NamedToolChoice):
        choice = choice.function
    elif isinstance(choice, AllowedToolsChoice):
        choice = choice.allowed_tools
    return [tool.function for tool in chat.tools or []], choice, "tools"


def _named(functions: list[FunctionDefinition], name: str, param: str) -> FunctionDefinition:
    for function in functions:
        if function.name == name:
            return function
    offered = ", ".join(f.name for f in functions)
    raise APIError(400, f"{param} names {name!r}, which is not among the tools offered ({offered})", param=param)
