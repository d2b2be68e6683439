"""Stream chunks and completion objects of echoed prompts, prompt logprobs and later chunks' text offsets."""

from __future__ import annotations

from tasks.messages.completions import completion_body
from tasks.messages.generation import Endpoint, EventType, StreamEvent, Usage
from tasks.messages.stream_chunks import StreamMeta, stream_chunks

PROMPT_LOGPROBS = [None, {"7": {"logprob": -1.5, "rank": 2, "decoded_token": " b"}}]


def entry(token: str, logprob: float | None) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": []}


def meta(endpoint: Endpoint) -> StreamMeta:
    return StreamMeta("cmpl-1", endpoint, "tiny", 0, include_usage=False)


def test_a_later_completion_chunk_counts_its_offsets_on() -> None:
    event = StreamEvent(EventType.DELTA, text="cd", logprobs=[entry("c", -0.1), entry("d", -0.2)], text_offset=5)
    [chunk] = stream_chunks(meta(Endpoint.COMPLETIONS), event)
    assert chunk["choices"][0]["logprobs"]["text_offset"] == [5, 6]


def test_prompt_logprobs_ride_on_the_choice_or_on_chats_chunk() -> None:
    event = StreamEvent(EventType.DELTA, text="a", index=3, prompt_logprobs=PROMPT_LOGPROBS)
    [completion_chunk] = stream_chunks(meta(Endpoint.COMPLETIONS), event)
    assert completion_chunk["choices"][0]["prompt_logprobs"] == PROMPT_LOGPROBS
    assert completion_chunk["choices"][0]["index"] == 3
    [chat_chunk] = stream_chunks(meta(Endpoint.CHAT), event)
    assert chat_chunk["prompt_logprobs"] == PROMPT_LOGPROBS and "prompt_logprobs" not in chat_chunk["choices"][0]


def test_token_ids_make_a_chunk_without_text_only_when_asked_for() -> None:
    event = StreamEvent(EventType.DELTA, text="", token_ids=[7, 9])
    assert stream_chunks(meta(Endpoint.COMPLETIONS), event) == []
    for endpoint in (Endpoint.COMPLETIONS, Endpoint.CHAT):
        asked = StreamMeta("cmpl-1", endpoint, "tiny", 0, include_usage=False, return_token_ids=True)
        [chunk] = stream_chunks(asked, event)
        assert chunk["choices"][0]["token_ids"] == [7, 9] and chunk["choices"][0]["finish_reason"] is None


def test_an_echoed_first_token_has_no_logprob_and_no_alternatives() -> None:
    body = completion_body(
        request_id="cmpl-1",
        endpoint=Endpoint.COMPLETIONS,
        model="tiny",
        created=0,
        text="ab",
        finish_reason="length",
        usage=Usage(2, 0),
        logprobs=[entry("a", None), entry("b", -1.5)],
        prompt_logprobs=PROMPT_LOGPROBS,
    )
    [choice] = body["choices"]
    assert choice["logprobs"]["token_logprobs"] == [None, -1.5]
    assert choice["logprobs"]["top_logprobs"] == [None, {}]
    assert choice["prompt_logprobs"] == PROMPT_LOGPROBS and "prompt_logprobs" not in body
