"""Constrained rows inside the continuous batch: each row's grammar holds for it alone, so constrained,
unconstrained and steered rows in one batch each equal their solo runs; speculation passes constrained rows by;
a preempted constrained row resumes with its matcher where its text is."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
from transformers import PreTrainedTokenizerBase

from tasks.config import Config
from tasks.messages.generation import SamplingParams
from tasks.messages.grammar import GrammarKind, GrammarSpec, ToolCallGrammar, ToolFunction
from tests.worker.engine.test_engine_steering import chat_prompt, feature_spec
from tests.worker.engine_harness import Collector, greedy, load_runner, serve, submit_together
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner

pytestmark = pytest.mark.usefixtures("tiny_sae_root")
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "likes": {"type": "array", "items": {"enum": ["cake", "pie", "soup"]}, "maxItems": 3},
    },
    "required": ["name", "age", "likes"],
}
SCHEMA = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(PERSON), "response_format.json_schema.schema")
MAX_TOKENS = 48
WEATHER = ToolFunction("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})
AUTO_TOOLS = ToolCallGrammar("hermes", (WEATHER,), is_parallel=True, is_triggered=True).to_spec("tools")


def text(tokenizer: PreTrainedTokenizerBase, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def test_a_constrained_row_writes_what_its_schema_allows(
    engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = chat_prompt(tokenizer, "describe Anna as JSON")
    collector = run_constrained(engine, "json", prompt, greedy(MAX_TOKENS), SCHEMA)
    value = json.loads(text(tokenizer, collector.token_ids))
    assert set(value) == {"name", "age", "likes"} and 0 <= value["age"] <= 120
    assert collector.outputs[-1].finish_reason.value == "stop"


def test_constrained_unconstrained_and_steered_rows_in_one_batch_each_equal_their_solo_runs(
    engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase, steering_demo: dict
) -> None:
    prompts = [chat_prompt(tokenizer, q) for q in ("describe Anna as JSON", "tell me about dogs", "count to 5")]
    seeded = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, seed=3)
    requests = [
        EngineRequest("constrained", prompts[0], greedy(MAX_TOKENS), grammar=SCHEMA),
        EngineRequest("plain", prompts[1], greedy(MAX_TOKENS)),
        EngineRequest("steered", prompts[2], greedy(MAX_TOKENS), steering=feature_spec(steering_demo, 0)),
        EngineRequest("seeded-constrained", prompts[1], seeded, grammar=SCHEMA),
        EngineRequest("constrained-steered", prompts[2], greedy(MAX_TOKENS), steering=feature_spec(steering_demo, 0),
                      grammar=SCHEMA),
    ]  # fmt: skip
    solo = [run_request(engine, dataclasses.replace(r, request_id=f"solo-{r.request_id}")) for r in requests]
    together = submit_together(engine, requests)
    assert [c.token_ids for c in together] == [c.token_ids for c in solo]
    for collector in (together[0], together[3], together[4]):
        json.loads(text(tokenizer, collector.token_ids))


def test_logprobs_of_a_constrained_row_come_from_its_allowed_tokens(
    engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = chat_prompt(tokenizer, "is it sunny?")
    sampling = SamplingParams(max_tokens=4, temperature=0.0, logprobs=5)
    choice = GrammarSpec(GrammarKind.CHOICE, json.dumps(["yes", "no"]), "guided_choice")
    collector = run_constrained(engine, "choice", prompt, sampling, choice)
    assert text(tokenizer, collector.token_ids) in ("yes", "no")
    first = collector.outputs[0].logprobs[0]
    pieces = {token_id: tokenizer.decode([token_id]) for token_id in range(len(tokenizer))}
    allowed = {
        token_id for token_id, piece in pieces.items() if piece and ("yes".startswith(piece) or "no".startswith(piece))
    }
    assert {token_id for token_id, _ in first.top} <= allowed
    assert sum(2.718281828**logprob for _, logprob in first.top) == pytest.approx(1.0, abs=1e-4)


def test_constrained_rows_never_speculate(engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase) -> None:
    prompt = chat_prompt(tokenizer, "describe Anna as JSON")
    sampling = dataclasses.replace(greedy(MAX_TOKENS), speculative_method="ngram", num_speculative_tokens=4)
    collector = run_constrained(engine, "no-spec", prompt, sampling, SCHEMA)
    assert collector.outputs[-1].num_proposed_tokens == 0
    assert collector.token_ids == run_constrained(engine, "plain-json", prompt, greedy(MAX_TOKENS), SCHEMA).token_ids


@pytest.fixture
def tight_engine(tiny_config: Config, caplog: pytest.LogCaptureFixture) -> Iterator[ContinuousEngine]:
    """A KV pool of 8 blocks of 16 tokens: three rows of ~60 tokens cannot all hold theirs, so rows are preempted."""
    config = dataclasses.replace(tiny_config, kv_cache_tokens=128, kv_block_size=16, enable_prefix_caching=False)
    yield from serve(load_runner(config), config, caplog)


def test_a_preempted_constrained_row_resumes_its_grammar(
    tight_engine: ContinuousEngine, engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = chat_prompt(tokenizer, "describe Anna as JSON")
    requests = [EngineRequest(f"tight-{i}", prompt, greedy(MAX_TOKENS), grammar=SCHEMA) for i in range(3)]
    together = submit_together(tight_engine, requests)
    assert tight_engine.stats.num_preemptions > 0
    expected = run_constrained(engine, "roomy", prompt, greedy(MAX_TOKENS), SCHEMA).token_ids
    assert [c.token_ids for c in together] == [expected] * 3


@pytest.mark.parametrize("grammar", [AUTO_TOOLS, SCHEMA], ids=["auto-tools-trigger", "json-schema"])
def test_a_constrained_row_that_ignores_eos_writes_on_past_it(
    engine: ContinuousEngine, runner: ModelRunner, tokenizer: PreTrainedTokenizerBase, grammar: GrammarSpec
) -> None:
    """EOS pushed up so far the row writes it whenever its grammar allows it: free text (the tools' trigger) allows
    it at once, a schema once its JSON is complete. The row ignores EOS, so it writes on, EOS after EOS, to
    max_tokens; the grammar, which would have ended at the first EOS, must not fail the row there."""
    [eos, *_] = sorted(runner.eos_token_ids)
    sampling = SamplingParams(max_tokens=MAX_TOKENS + 8, temperature=0.0, ignore_eos=True, logit_bias=((eos, 100.0),))
    collector = run_constrained(engine, "past-eos", chat_prompt(tokenizer, "describe Anna as JSON"), sampling, grammar)
    assert collector.outputs[-1].error is None and len(collector.token_ids) == MAX_TOKENS + 8
    first_eos = collector.token_ids.index(eos)
    assert set(collector.token_ids[first_eos:]) == {eos}
    if grammar is SCHEMA:
        json.loads(text(tokenizer, collector.token_ids[:first_eos]))
    else:
        assert first_eos == 0


def run_request(engine: ContinuousEngine, request: EngineRequest) -> Collector:
    return submit_together(engine, [request])[0]


def run_constrained(
    engine: ContinuousEngine, request_id: str, prompt: list[int], sampling: SamplingParams, grammar: GrammarSpec
) -> Collector:
    return run_request(engine, EngineRequest(request_id, prompt, sampling, grammar=grammar))


def test_a_grammar_that_does_not_compile_is_the_requests_error_naming_its_field(
    engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase
) -> None:
    bad = GrammarSpec(GrammarKind.REGEX, "[a-", "structured_outputs.regex")
    collector = run_constrained(engine, "bad", chat_prompt(tokenizer, "hi"), greedy(4), bad)
    [output] = collector.outputs
    assert output.is_request_error and output.error_param == "structured_outputs.regex"
    assert output.error.startswith("structured_outputs.regex does not compile")
