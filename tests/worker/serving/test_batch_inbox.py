"""A chunk's inbox: its thread wakes for news only, and takes each request's waiting outputs as one."""

from __future__ import annotations

import threading

from tasks.messages.generation import FinishReason, TokenLogprob
from tasks.messages.steering import MonitoredPosition, SteeringSpec
from worker.engine.interface import EngineOutput
from worker.serving.batch_inbox import ChunkInbox, joined_output


def test_outputs_before_a_line_ends_wait_for_news() -> None:
    inbox = ChunkInbox()
    inbox.put(EngineOutput("a", [1]))
    assert inbox.take_news(timeout_s=0.01) == []
    inbox.put(EngineOutput("b", [7]))
    inbox.put(EngineOutput("a", [2], FinishReason.LENGTH))
    assert inbox.take_news(timeout_s=0.01) == [
        EngineOutput("a", [1, 2], FinishReason.LENGTH),
        EngineOutput("b", [7]),
    ]
    assert inbox.take_news(timeout_s=0.01) == []


def test_every_output_of_a_line_with_stop_strings_is_news_and_stays_whole() -> None:
    inbox = ChunkInbox()
    inbox.put_urgent(EngineOutput("s", [1]))
    inbox.put_urgent(EngineOutput("s", [2]))
    assert inbox.take_news(timeout_s=0.01) == [EngineOutput("s", [1]), EngineOutput("s", [2])]


def test_news_wakes_a_waiting_taker() -> None:
    inbox = ChunkInbox()
    threading.Timer(0.05, inbox.put, args=(EngineOutput("a", [], error="boom"),)).start()
    assert inbox.take_news(timeout_s=5.0) == [EngineOutput("a", [], error="boom")]


def test_joined_output_adds_up_what_a_request_emitted() -> None:
    steering = SteeringSpec(sae_id="sae")
    first = EngineOutput(
        "a",
        [5, 6],
        logprobs=(TokenLogprob(5, -0.1), TokenLogprob(6, -0.2)),
        num_cached_tokens=16,
        num_proposed_tokens=3,
        num_accepted_tokens=1,
        steering=steering,
        monitor=(MonitoredPosition(0, 5, ()),),
    )
    second = EngineOutput("a", [7], logprobs=(TokenLogprob(7, -0.3),), monitor=(MonitoredPosition(1, 6, ()),))
    abort = EngineOutput("a", [], FinishReason.ABORT)  # an abort carries no counts
    assert joined_output([first, second, abort]) == EngineOutput(
        "a",
        [5, 6, 7],
        FinishReason.ABORT,
        logprobs=(TokenLogprob(5, -0.1), TokenLogprob(6, -0.2), TokenLogprob(7, -0.3)),
        num_cached_tokens=16,
        num_proposed_tokens=3,
        num_accepted_tokens=1,
        steering=steering,
        monitor=(MonitoredPosition(0, 5, ()), MonitoredPosition(1, 6, ())),
    )
