"""A grammar that dead-ends mid-generation (its first token can be written, then it allows none; or it allows only a
stop token that min_tokens holds back) ends its own request with the request's error naming the grammar's field;
every other row of those steps, constrained or not, gets exactly the tokens it would have had alone."""

from __future__ import annotations

import dataclasses
import json

import pytest
from transformers import PreTrainedTokenizerBase

from tasks.messages.generation import SamplingParams
from tasks.messages.grammar import GrammarKind, GrammarSpec
from tests.worker.engine.grammar.test_engine_grammar import SCHEMA, run_request
from tests.worker.engine.test_engine_steering import chat_prompt
from tests.worker.engine_harness import greedy, submit_together
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineRequest

pytestmark = pytest.mark.usefixtures("tiny_sae_root")
NO_BASE_CASE = GrammarSpec(GrammarKind.GRAMMAR, 'root ::= "a" b\nb ::= b "x"', "guided_grammar")
ONE_CHOICE = GrammarSpec(GrammarKind.CHOICE, json.dumps(["yes"]), "guided_choice")


def test_a_dead_end_ends_its_request_alone_and_its_step_mates_match_their_solo_runs(
    engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompts = [chat_prompt(tokenizer, q) for q in ("describe Anna as JSON", "tell me about dogs", "count to 5")]
    mates = [
        EngineRequest("constrained", prompts[0], greedy(24), grammar=SCHEMA),
        EngineRequest("plain", prompts[1], greedy(24)),
        EngineRequest("seeded", prompts[2], SamplingParams(max_tokens=24, temperature=0.8, seed=3)),
    ]
    solo = [run_request(engine, dataclasses.replace(r, request_id=f"solo-{r.request_id}")) for r in mates]
    held_back = SamplingParams(max_tokens=24, temperature=0.0, min_tokens=8)
    dead_ends = [
        EngineRequest("no-base-case", prompts[1], greedy(24), grammar=NO_BASE_CASE),
        EngineRequest("held-back", prompts[2], held_back, grammar=ONE_CHOICE),
    ]
    *together, no_base_case, held_back_end = submit_together(engine, [*mates, *dead_ends])

    assert [c.token_ids for c in together] == [c.token_ids for c in solo]
    assert all(c.outputs[-1].error is None for c in together)
    for collector, param, why in (
        (no_base_case, "guided_grammar", "allows no token here: no text can complete it"),
        (held_back_end, "guided_choice", "but a stop token, which min_tokens holds back"),
    ):
        last = collector.outputs[-1]
        assert last.is_request_error and last.error_param == param, last
        assert last.error.startswith(f"{param}: the grammar allows no token here") and why in last.error, last.error
        assert collector.token_ids, "the grammar's first tokens were written before it dead-ended"
    assert tokenizer.decode(no_base_case.token_ids) == "a"
    assert run_request(engine, dataclasses.replace(mates[1], request_id="after")).token_ids == solo[1].token_ids
