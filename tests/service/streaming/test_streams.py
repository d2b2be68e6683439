"""Resumable SSE: every frame carries an id, and Last-Event-ID replays exactly what came after it (leaving a stream
and coming back: tests/service/streaming/test_stream_resume.py)."""

from __future__ import annotations

import requests

from scripts.stack import Stack
from tests.service.http import auth
from tests.service.sse import Frame, data_frames, read_frames


def start_stream(stack: Stack, max_tokens: int, ignore_eos: bool = False) -> requests.Response:
    body = {
        "model": stack.config.model_name,
        "messages": [{"role": "user", "content": "tell me about cats"}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "ignore_eos": ignore_eos,
    }
    return requests.post(
        f"{stack.base_url}/v1/chat/completions", json=body, headers=auth(stack), stream=True, timeout=120
    )


def events(stack: Stack, request_id: str, last_event_id: str | None) -> list[Frame]:
    headers = {**auth(stack), **({"Last-Event-ID": last_event_id} if last_event_id else {})}
    url = f"{stack.base_url}/v1/requests/{request_id}/events"
    with requests.get(url, headers=headers, stream=True, timeout=120) as response:
        assert response.status_code == 200, response.text
        return data_frames(list(read_frames(response)))


def stream_of_several_entries(stack: Stack) -> list[Frame]:
    """The data frames of a stream of START, at least two DELTAs and FINAL. A stream's tokens go out every
    STREAM_INTERVAL_S once its request is claimed; the tokens generated before the claim go out with START as one
    DELTA. On an idle machine whose engine outruns a claim under the suite's load, 120 tokens all came before it (three
    entries): a longer stream is asked for then."""
    for max_tokens in (120, 480, 1920):
        with start_stream(stack, max_tokens=max_tokens, ignore_eos=True) as response:
            frames = data_frames(list(read_frames(response)))
        if len({frame.event_id.split(":")[0] for frame in frames}) >= 4:
            return frames
    raise AssertionError(f"no stream of START, DELTAs and FINAL: the last had {len(frames)} frames")


def test_resume_after_any_frame_gives_exactly_the_rest(stack: Stack) -> None:
    original = stream_of_several_entries(stack)
    request_id = original[0].json["id"]
    assert events(stack, request_id, None) == original
    assert all(frame.event_id for frame in original), "every data frame carries an id"
    for index, frame in enumerate(original[:-1]):
        assert events(stack, request_id, frame.event_id) == original[index + 1 :], f"resume after {frame.event_id}"
    done = original[-1]
    assert events(stack, request_id, done.event_id) == [done]  # after the final event only the end marker is left
    past = f"{int(done.event_id.split('-')[0]) + 1000}-0"
    assert events(stack, request_id, past) == [Frame(past, "[DONE]")]


def test_the_finish_and_usage_chunks_are_resumable(stack: Stack) -> None:
    with start_stream(stack, max_tokens=8) as response:
        original = data_frames(list(read_frames(response)))
    finish, usage, done = original[-3:]
    assert finish.json["choices"][0]["finish_reason"] and usage.json["usage"] and done.data == "[DONE]"
    assert events(stack, finish.json["id"], original[-4].event_id) == [finish, usage, done]
    assert events(stack, finish.json["id"], finish.event_id) == [usage, done]
    assert events(stack, finish.json["id"], usage.event_id) == [done]


def test_resume_while_the_request_is_still_running(stack: Stack) -> None:
    with start_stream(stack, max_tokens=1500, ignore_eos=True) as response:
        frames = (frame for frame in read_frames(response) if frame.data is not None)
        first = [next(frames) for _ in range(3)]
        request_id = first[0].json["id"]
        status = requests.get(f"{stack.base_url}/v1/requests/{request_id}", headers=auth(stack), timeout=10).json()[
            "status"
        ]
        resumed = events(stack, request_id, first[-1].event_id)
        rest = data_frames(list(frames))
    assert status == "running"
    assert resumed == rest
    assert resumed[-1].data == "[DONE]"


def test_unknown_request_and_bad_event_id(stack: Stack) -> None:
    missing = requests.get(f"{stack.base_url}/v1/requests/chatcmpl-nope", headers=auth(stack), timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    with start_stream(stack, max_tokens=4) as response:
        request_id = data_frames(list(read_frames(response)))[0].json["id"]
    # the second: past Redis's range, which would fail a shared XREAD
    for bad_id in ("yesterday", f"{2**64}-0", "1700000000000-0:x"):
        bad = requests.get(
            f"{stack.base_url}/v1/requests/{request_id}/events",
            headers={**auth(stack), "Last-Event-ID": bad_id},
            timeout=10,
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "Last-Event-ID"


def test_return_token_ids_puts_every_token_in_a_chunk(stack: Stack) -> None:
    body = {
        "model": stack.config.model_name,
        "prompt": "the cat",
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    url = f"{stack.base_url}/v1/completions"
    with requests.post(url, json=body, headers=auth(stack), stream=True, timeout=120) as response:
        frames = data_frames(list(read_frames(response)))
    chunks = [frame.json for frame in frames[:-1]]
    token_chunks = [chunk["choices"][0] for chunk in chunks if chunk["choices"] and "token_ids" in chunk["choices"][0]]
    assert sum(len(choice["token_ids"]) for choice in token_chunks) == chunks[-1]["usage"]["completion_tokens"] == 12
    assert "".join(choice["text"] for choice in token_chunks) == "".join(
        choice["text"] for chunk in chunks for choice in chunk["choices"]
    ), "the text rides on the same chunks as its tokens"
    unstreamed = {**body, "stream": False, "stream_options": None}
    with requests.post(url, json=unstreamed, headers=auth(stack), timeout=120) as refused:
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "return_token_ids"
