"""Resumable SSE: Last-Event-ID replays exactly what came after; a client that leaves cancels generation."""

from __future__ import annotations

import time

import requests

from scripts.stack import Stack
from tasks.streams import entry_order
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


def entry_ids(frames: list[Frame]) -> list[str]:
    """The stream entry each frame came from: frames without an id belong to the next frame that has one."""
    owners: list[str] = []
    pending = 0
    for frame in frames:
        pending += 1
        if frame.event_id is not None:
            owners += [frame.event_id] * pending
            pending = 0
    assert pending == 0, "the last frame must carry an id"
    return owners


def test_resume_after_any_event_gives_exactly_the_rest(stack: Stack) -> None:
    with start_stream(stack, max_tokens=20) as response:
        original = data_frames(list(read_frames(response)))
    request_id = original[0].json["id"]
    assert events(stack, request_id, None) == original
    owners = entry_ids(original)
    distinct = sorted(set(owners), key=entry_order)
    assert len(distinct) >= 4, "a stream of START, DELTAs and FINAL"
    for after in distinct:
        expected = [
            frame for frame, owner in zip(original, owners, strict=True) if entry_order(owner) > entry_order(after)
        ]
        if after == distinct[-1]:
            expected = [Frame(after, "[DONE]")]  # after the final event only the end marker is left
        assert events(stack, request_id, after) == expected, f"resume after {after}"


def test_the_finish_and_usage_chunks_share_one_resumable_entry(stack: Stack) -> None:
    with start_stream(stack, max_tokens=8) as response:
        original = data_frames(list(read_frames(response)))
    finish, usage, done = original[-3:]
    assert finish.json["choices"][0]["finish_reason"] and usage.json["usage"] and done.data == "[DONE]"
    assert finish.event_id is None and usage.event_id is None and done.event_id is not None
    resumed = events(stack, finish.json["id"], original[-4].event_id)
    assert resumed == [finish, usage, done]


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


def test_client_disconnect_cancels_generation(stack: Stack) -> None:
    response = start_stream(stack, max_tokens=2000, ignore_eos=True)
    frames = (frame for frame in read_frames(response) if frame.data is not None)
    request_id = next(frames).json["id"]
    for _ in range(3):
        next(frames)
    response.close()
    record = _wait_for_terminal(stack, request_id, timeout_s=30)
    assert record["status"] == "cancelled"
    assert record["response"]["choices"][0]["finish_reason"] == "abort"
    assert record["response"]["usage"]["completion_tokens"] < 2000


def test_unknown_request_and_bad_event_id(stack: Stack) -> None:
    missing = requests.get(f"{stack.base_url}/v1/requests/chatcmpl-nope", headers=auth(stack), timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    with start_stream(stack, max_tokens=4) as response:
        request_id = data_frames(list(read_frames(response)))[0].json["id"]
    for bad_id in ("yesterday", f"{2**64}-0"):  # the second: past Redis's range, which would fail a shared XREAD
        bad = requests.get(
            f"{stack.base_url}/v1/requests/{request_id}/events",
            headers={**auth(stack), "Last-Event-ID": bad_id},
            timeout=10,
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "Last-Event-ID"


def _wait_for_terminal(stack: Stack, request_id: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = requests.get(f"{stack.base_url}/v1/requests/{request_id}", headers=auth(stack), timeout=10).json()
        if record["status"] not in ("queued", "running"):
            return record
        time.sleep(0.1)
    raise AssertionError(f"{request_id} still running after {timeout_s} s")
