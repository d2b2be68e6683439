"""A pass's outputs of one request applied as events: a choice's token-only outputs of several engine steps are applied
as one, with the same events, and outputs that must be applied one at a time still are."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from tasks.messages.generation import FinishReason, StreamEvent, TokenLogprob
from tests.worker.serving.test_output_processor import CancelRecorder, followed_request
from worker.engine.interface import EngineOutput
from worker.serving.followed_request import FollowedRequest
from worker.text.choice import Choice


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)


class CountedChoice(Choice):
    """A choice that counts the outputs applied to it."""

    applied: int = 0

    def apply(self, output: EngineOutput, tokenizer: PreTrainedTokenizerFast):  # type: ignore[override]
        self.applied += 1
        return super().apply(output, tokenizer)


def counted(followed: FollowedRequest) -> FollowedRequest:
    for choice_id, choice in followed.choices.items():
        followed.choices[choice_id] = CountedChoice(
            **{name: getattr(choice, name) for name in choice.__dataclass_fields__}
        )
    return followed


def step_outputs(request_id: str, token_ids: list[int], finish: FinishReason | None) -> list[EngineOutput]:
    """One output an engine step, the last with the finish reason, each with the cumulative counts a step sends."""
    return [
        EngineOutput(
            request_id,
            [token_id],
            finish if position == len(token_ids) - 1 else None,
            num_cached_tokens=3,
            num_proposed_tokens=position,
            num_accepted_tokens=position // 2,
        )
        for position, token_id in enumerate(token_ids)
    ]


def summary(events: list[StreamEvent], followed: FollowedRequest) -> list[tuple]:
    choice = next(iter(followed.choices.values()))
    made = [(event.index, event.text, event.token_ids, event.finish_reason) for event in events]
    return [*made, (choice.num_tokens, choice.num_cached_tokens, choice.num_proposed_tokens, choice.num_accepted_tokens,
                    choice.finish_reason, choice.text_stream.text)]  # fmt: skip


@pytest.mark.parametrize("text", [" a small dog runs", " caf\u00e9 na\u00efve \u00fcber \u2603 snow"])
@pytest.mark.parametrize("finish", [None, FinishReason.LENGTH, FinishReason.STOP])
def test_a_choices_token_only_outputs_are_applied_as_one_with_the_same_events(
    tokenizer: PreTrainedTokenizerFast, text: str, finish: FinishReason | None
) -> None:
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    together = counted(followed_request(tokenizer))
    one_at_a_time = followed_request(tokenizer)
    request_id = together.request.request_id
    events = together.apply(step_outputs(request_id, token_ids, finish), tokenizer, CancelRecorder())  # type: ignore[arg-type]
    expected: list[StreamEvent] = []
    for output in step_outputs(one_at_a_time.request.request_id, token_ids, finish):
        expected += one_at_a_time.apply([output], tokenizer, CancelRecorder())  # type: ignore[arg-type]
    joined = [(e.index, "".join(x.text for x in expected), [t for x in expected for t in x.token_ids], e.finish_reason)
              for e in expected[-1:]]  # fmt: skip
    assert summary(events, together) == joined + summary([], one_at_a_time)
    assert next(iter(together.choices.values())).applied == 1


def test_outputs_are_applied_one_at_a_time_where_a_stop_string_may_end_the_choice(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    followed = counted(followed_request(tokenizer, stop=("dog",)))
    token_ids = tokenizer.encode(" a small dog runs far", add_special_tokens=False)
    engine = CancelRecorder()
    events = followed.apply(step_outputs(followed.request.request_id, token_ids, None), tokenizer, engine)  # type: ignore[arg-type]
    choice = next(iter(followed.choices.values()))
    assert "".join(event.text for event in events) == " a small "
    # the choice ends with the token that completed "dog": the tokens after it are not its own
    assert choice.num_tokens < len(token_ids) and choice.finish_reason == FinishReason.STOP
    assert engine.cancelled == [followed.request.request_id]


def test_outputs_that_carry_more_than_tokens_are_applied_one_at_a_time(tokenizer: PreTrainedTokenizerFast) -> None:
    followed = counted(followed_request(tokenizer))
    request_id = followed.request.request_id
    outputs = [EngineOutput(request_id, [5]), EngineOutput(request_id, [6], error="the engine broke")]
    followed.apply(outputs, tokenizer, CancelRecorder())  # type: ignore[arg-type]
    assert next(iter(followed.choices.values())).applied == 2
    assert followed.error is not None


def test_each_run_of_one_choices_token_only_outputs_is_applied_as_one(tokenizer: PreTrainedTokenizerFast) -> None:
    """Runs end where another choice's output, an output that carries more than tokens, or a final output comes."""
    together, one_at_a_time = counted(followed_request(tokenizer, n=2)), followed_request(tokenizer, n=2)
    ids = tokenizer.encode(" the small dog runs to the big red barn", add_special_tokens=False)

    def outputs(followed: FollowedRequest) -> list[EngineOutput]:
        first, second = followed.choices
        return [
            EngineOutput(first, ids[0:1], num_cached_tokens=2),
            EngineOutput(first, ids[1:2], num_proposed_tokens=1),  # joined with the one before
            EngineOutput(second, ids[2:3]),
            EngineOutput(second, ids[3:4], logprobs=(TokenLogprob(ids[3], -0.5),)),  # alone: it carries more
            EngineOutput(first, ids[4:5], num_accepted_tokens=1),
            EngineOutput(first, ids[5:6], FinishReason.LENGTH),  # joined: it ends the run
        ]

    events = together.apply(outputs(together), tokenizer, CancelRecorder())  # type: ignore[arg-type]
    expected = [
        event
        for output in outputs(one_at_a_time)
        for event in one_at_a_time.apply([output], tokenizer, CancelRecorder())  # type: ignore[arg-type]
    ]
    assert [choice.applied for choice in together.choices.values()] == [2, 2]

    def by_choice(made: list[StreamEvent]) -> list[tuple[str, list[int]]]:
        of = [[event for event in made if event.index == index] for index in (0, 1)]
        return [
            ("".join(event.text for event in events), [t for event in events for t in event.token_ids]) for events in of
        ]

    assert by_choice(events) == by_choice(expected)
    for mine, theirs in zip(together.choices.values(), one_at_a_time.choices.values(), strict=True):
        counts = ("num_tokens", "num_cached_tokens", "num_proposed_tokens", "num_accepted_tokens", "finish_reason")
        assert [getattr(mine, name) for name in counts] == [getattr(theirs, name) for name in counts]
