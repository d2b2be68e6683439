"""Grammar compiles: off the calling thread, once per spec (a hit runs no compile), errors naming the request's
field, and a time limit."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerFast

from tasks.messages.grammar import GrammarKind, GrammarSpec, ToolCallGrammar, ToolFunction
from tasks.messages.tool_calls import parse_reply
from worker.engine.grammar.compiler import GrammarCompiler, GrammarError

logger = logging.getLogger(__name__)
EOT_ID = 4  # models/tiny: <|eot_id|>
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def compiler(model_dir: Path, timeout_s: float = 10.0) -> GrammarCompiler:
    return GrammarCompiler(str(model_dir), 2048, frozenset({EOT_ID}), timeout_s, cache_size=4)


def accepts(compiled: xgr.CompiledGrammar, text: str) -> bool:
    matcher = xgr.GrammarMatcher(compiled)
    return matcher.accept_string(text) and matcher.is_completed()


def test_each_kind_compiles_to_what_it_describes(tiny_model_dir: Path) -> None:
    grammars = compiler(tiny_model_dir)
    schema = grammars.compile(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA), "p"))
    assert accepts(schema, '{"name": "Anna"}') and not accepts(schema, '{"age": 3}')
    any_object = grammars.compile(GrammarSpec(GrammarKind.JSON_OBJECT, "", "p"))
    assert accepts(any_object, '{"a": [1, {"b": null}]}') and not accepts(any_object, "[1]")
    regex = grammars.compile(GrammarSpec(GrammarKind.REGEX, r"[a-z]+@[a-z]+\.com", "p"))
    assert accepts(regex, "anna@mail.com") and not accepts(regex, "anna")
    choice = grammars.compile(GrammarSpec(GrammarKind.CHOICE, json.dumps(["yes", 'say "no"']), "p"))
    assert accepts(choice, 'say "no"') and not accepts(choice, "maybe")
    ebnf = grammars.compile(GrammarSpec(GrammarKind.GRAMMAR, 'root ::= "a" "b"*', "p"))
    assert accepts(ebnf, "abbb") and not accepts(ebnf, "ba")


def test_tool_calls_follow_the_parser_format_and_the_argument_schema(tiny_model_dir: Path) -> None:
    weather = ToolFunction("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    grammars = compiler(tiny_model_dir)
    one = grammars.compile(ToolCallGrammar("hermes", (weather,), is_parallel=False).to_spec("tool_choice"))
    assert accepts(one, call) and not accepts(one, call + "\n" + call) and not accepts(one, "It is sunny.")
    many = grammars.compile(ToolCallGrammar("hermes", (weather,), is_parallel=True).to_spec("tool_choice"))
    assert accepts(many, call + "\n" + call)
    llama = grammars.compile(ToolCallGrammar("llama3_json", (weather,), is_parallel=False).to_spec("tool_choice"))
    assert accepts(llama, '{"name": "get_weather", "parameters": {"city": "Paris"}}')


def test_auto_mode_allows_text_and_holds_each_started_call(tiny_model_dir: Path) -> None:
    weather = ToolFunction("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a</tool_call>"}}\n</tool_call>'
    grammars = compiler(tiny_model_dir)
    auto = grammars.compile(ToolCallGrammar("hermes", (weather,), True, is_triggered=True).to_spec("tools"))
    assert accepts(auto, "It is sunny.") and accepts(auto, "Let me look. " + call + "\n" + call)
    assert not accepts(auto, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert not accepts(auto, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "windy"}')


@pytest.mark.parametrize("seed", range(8))
def test_a_started_call_ends_as_a_valid_call_whatever_the_weights(tiny_model_dir: Path, seed: int) -> None:
    """Any token the grammar allows may be the one sampled: random choices among them stand for any weights."""
    name, age = {"type": "string", "maxLength": 8}, {"type": "integer", "minimum": 0, "maximum": 150}
    user = {"type": "object", "properties": {"name": name, "age": age}}
    user |= {"required": ["name", "age"]}
    functions = (ToolFunction("User", user), ToolFunction("get_time", {"type": "object", "properties": {}}))
    grammars = compiler(tiny_model_dir)
    auto = grammars.compile(ToolCallGrammar("hermes", functions, False, is_triggered=True).to_spec("tools"))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)
    matcher, bitmask = xgr.GrammarMatcher(auto), xgr.allocate_token_bitmask(1, 2048)
    assert matcher.accept_string("Sure. <tool_call>")
    generator, token_ids = torch.Generator().manual_seed(seed), []
    while not matcher.is_terminated() and len(token_ids) < 400:
        matcher.fill_next_token_bitmask(bitmask)
        allowed = [t for t in range(len(tokenizer)) if bitmask[0, t // 32] >> (t % 32) & 1]
        token_id = allowed[int(torch.randint(len(allowed), (1,), generator=generator))]
        if token_id == EOT_ID:
            break
        assert matcher.accept_token(token_id)
        token_ids.append(token_id)
    text = "Sure. <tool_call>" + tokenizer.decode(token_ids)
    assert matcher.is_terminated() or token_id == EOT_ID, text  # the call closed, and only the end may follow
    reply = parse_reply("hermes", text, "r")
    assert [call.name in ("User", "get_time") for call in reply.tool_calls] == [True], text
    assert isinstance(json.loads(reply.tool_calls[0].arguments), dict)


def test_a_spec_compiles_once_and_a_failure_is_remembered(tiny_model_dir: Path) -> None:
    grammars = compiler(tiny_model_dir)
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA), "response_format.json_schema.schema")
    first = grammars.compile(spec)
    assert grammars.compile(GrammarSpec(spec.kind, spec.value, "guided_json")) is first
    bad = GrammarSpec(GrammarKind.REGEX, "[a-", "guided_regex")
    for _ in range(2):
        with pytest.raises(GrammarError, match="guided_regex does not compile: Regex parsing error") as error:
            grammars.compile(bad)
        assert error.value.param == "guided_regex"
    assert grammars.num_compiles == 2


ONLY_ITSELF = {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        # a definition whose only branch is itself (xgrammar 0.2.9 refuses a bare `$ref` chain as it compiles)
        (GrammarKind.JSON_SCHEMA, json.dumps(ONLY_ITSELF)),
        (GrammarKind.REGEX, "[^\\s\\S]"),
        (GrammarKind.GRAMMAR, 'root ::= a\na ::= a "x"'),
    ],
)
def test_a_grammar_matching_no_text_is_the_request_error(tiny_model_dir: Path, kind: GrammarKind, value: str) -> None:
    with pytest.raises(GrammarError, match="p can never be matched") as error:
        compiler(tiny_model_dir).compile(GrammarSpec(kind, value, "p"))
    assert error.value.param == "p"


def test_a_bare_self_reference_is_the_request_error_whichever_way_xgrammar_sees_it(tiny_model_dir: Path) -> None:
    """A `$ref` that only refers to itself: xgrammar 0.2.9 and later refuse it as they compile, 0.2.8 compiles it to
    a grammar that matches no text. Either way the request fails alone, with its field named."""
    bare = json.dumps({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})
    with pytest.raises(GrammarError, match=r"^p (does not compile|can never be matched)") as error:
        compiler(tiny_model_dir).compile(GrammarSpec(GrammarKind.JSON_SCHEMA, bare, "p"))
    assert error.value.param == "p"


def test_a_compile_past_the_time_limit_is_the_request_error(tiny_model_dir: Path) -> None:
    properties = {f"p{i}": {"type": "string", "pattern": "[a-z]{3,9}@[a-z]{2,8}\\.(com|org)"} for i in range(200)}
    slow = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps({"type": "object", "properties": properties}), "guided_json")
    grammars = compiler(tiny_model_dir, timeout_s=0.001)
    with pytest.raises(GrammarError, match=r"did not compile within 0\.001s") as error:
        grammars.compile(slow)
    assert error.value.param == "guided_json"
    grammars.close()


class SlowStartingCompiler(GrammarCompiler):
    """A worker on a loaded machine: reading the tokenizer for its first compile process takes 2 s."""

    def _new_tokenizer_info(self) -> xgr.TokenizerInfo:
        time.sleep(2.0)
        return super()._new_tokenizer_info()


def test_starting_a_compile_process_does_not_count_against_the_time_limit(tiny_model_dir: Path) -> None:
    grammars = SlowStartingCompiler(str(tiny_model_dir), 2048, frozenset({EOT_ID}), 1.0, cache_size=4)
    compiled = grammars.compile(GrammarSpec(GrammarKind.REGEX, "[a-c]+", "guided_regex"))
    assert accepts(compiled, "abc")
    grammars.close()


def cpu_seconds_of_this_process_and_its_children() -> float:
    processes = [psutil.Process(), *psutil.Process().children(recursive=True)]
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:  # a compile process killed meanwhile
            continue
        total += times.user + times.system
    return total


def test_a_compile_past_the_time_limit_stops_using_the_cpu(tiny_model_dir: Path) -> None:
    """A flood of slow grammars (each 20,000 choices: about 8 s of compile here) is refused at the time limit, and
    the compiles stop then: queued ones never start, running ones are killed."""
    compiler(tiny_model_dir).compile(GrammarSpec(GrammarKind.REGEX, "a", "p"))  # the forkserver has loaded xgrammar
    grammars = compiler(tiny_model_dir, timeout_s=1.0)
    flood = [
        GrammarSpec(GrammarKind.CHOICE, json.dumps([f"item {n} number {i}" for i in range(20_000)]), "guided_choice")
        for n in range(4)
    ]

    def refusal(spec: GrammarSpec) -> str:
        with pytest.raises(GrammarError, match="did not compile within 1s") as error:
            grammars.compile(spec)
        return error.value.param

    with ThreadPoolExecutor(len(flood)) as requests:
        assert list(requests.map(refusal, flood)) == ["guided_choice"] * len(flood)
    time.sleep(1.0)  # a killed compile's process is gone well within this
    before = cpu_seconds_of_this_process_and_its_children()
    time.sleep(2.0)
    busy_s = cpu_seconds_of_this_process_and_its_children() - before
    logger.info("grammar flood: %.2f s of CPU in the 2 s after %d refusals", busy_s, len(flood))
    assert busy_s < 0.5, f"{busy_s:.1f} s of CPU in 2 s after every request was refused"
    grammars.close()
