"""Messages survive JSON both ways."""

from __future__ import annotations

import json

from tasks.messages.generation import (
    Endpoint,
    ErrorInfo,
    EventType,
    FinishReason,
    GenerateRequest,
    SamplingParams,
    StreamEvent,
    TokenLogprob,
    Usage,
)


def test_generate_request_round_trips_through_json() -> None:
    request = GenerateRequest(
        request_id="chatcmpl-1",
        endpoint=Endpoint.CHAT,
        model="tiny",
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingParams(max_tokens=5, temperature=0.5, top_p=0.9, seed=7, stop=("a", "b")),
        created=1700000000,
    )
    assert GenerateRequest.from_dict(json.loads(json.dumps(request.to_dict()))) == request


def test_stream_events_round_trip_through_json() -> None:
    events = [
        StreamEvent(EventType.START),
        StreamEvent(EventType.DELTA, text="hé", token_ids=[4, 5]),
        StreamEvent(EventType.DELTA, text="a", token_ids=[6], logprobs=[{"token": "a", "logprob": -0.5}]),
        StreamEvent(EventType.FINAL, finish_reason=FinishReason.LENGTH, usage=Usage(3, 4)),
        StreamEvent(EventType.FINAL, usage=Usage(3, 0), error=ErrorInfo("boom", "server_error")),
    ]
    for event in events:
        assert StreamEvent.from_dict(json.loads(json.dumps(event.to_dict()))) == event
    assert Usage(3, 4).to_dict()["total_tokens"] == 7


def test_token_logprobs_round_trip_through_json() -> None:
    entry = TokenLogprob(7, -0.25, ((7, -0.25), (3, -2.0)))
    assert TokenLogprob.from_dict(json.loads(json.dumps(entry.to_dict()))) == entry
