"""The Batch API end to end on real processes: the openai client's files and batches calls, output and error
files, progress events resumed with Last-Event-ID, and cancel in the middle of a run."""

from __future__ import annotations

import json
import time

import pytest
import requests

from scripts.stack import Stack
from tests.service.batch_helpers import chat_line, client_for, read_jsonl, submit, wait_for_end, wait_until
from tests.service.http import auth
from tests.service.sse import data_frames, read_frames

pytestmark = pytest.mark.postgres  # on both databases: the batch ledger's claims and counts are SQL


def test_openai_client_runs_a_batch_to_its_output_file(stack: Stack) -> None:
    lines = [chat_line(stack, f"req-{i}", f"what is {i} plus {i}?", seed=i) for i in range(6)]
    lines.insert(3, {"custom_id": "broken", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "x"}})
    batch_id = submit(stack, lines)
    batch = wait_for_end(stack, batch_id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (7, 6, 1)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    outputs = read_jsonl(stack, batch.output_file_id)
    assert sorted(line["custom_id"] for line in outputs) == [f"req-{i}" for i in range(6)]
    for line in outputs:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == stack.config.model_name
        assert 1 <= body["usage"]["completion_tokens"] <= 6 and body["choices"][0]["finish_reason"] in (
            "stop",
            "length",
        )
    [error] = read_jsonl(stack, batch.error_file_id)
    assert error["custom_id"] == "broken" and error["error"]["line"] == 4 and error["response"] is None


def test_a_batch_of_completions_gives_the_same_text_as_the_endpoint(stack: Stack) -> None:
    body = {"model": stack.config.model_name, "prompt": "the cat", "max_tokens": 8, "temperature": 0}
    line = {"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": body}
    batch = wait_for_end(stack, submit(stack, [line], endpoint="/v1/completions"))
    [output] = read_jsonl(stack, batch.output_file_id)
    direct = client_for(stack).completions.create(**body)
    assert output["response"]["body"]["object"] == "text_completion"
    assert output["response"]["body"]["choices"][0]["text"] == direct.choices[0].text


def test_progress_events_cover_every_line_and_resume_after_last_event_id(stack: Stack) -> None:
    batch_id = submit(stack, [chat_line(stack, f"e-{i}") for i in range(4)])
    url = f"{stack.base_url}/v1/batches/{batch_id}/events"
    with requests.get(url, headers=auth(stack), stream=True, timeout=120) as response:
        frames = data_frames(list(read_frames(response)))
    assert frames[-1].data == "[DONE]"
    events = [frame.json for frame in frames[:-1]]
    assert sorted(event["custom_id"] for event in events if event["type"] == "line") == [f"e-{i}" for i in range(4)]
    assert events[-1]["type"] == "status" and events[-1]["status"] == "completed"
    assert events[-1]["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    with requests.get(
        url, headers={**auth(stack), "Last-Event-ID": frames[1].event_id}, stream=True, timeout=120
    ) as response:
        resumed = data_frames(list(read_frames(response)))
    assert [frame.data for frame in resumed] == [frame.data for frame in frames[2:]]


def test_cancel_mid_run_keeps_finished_lines_and_stops_the_rest(stack: Stack) -> None:
    short = [chat_line(stack, f"short-{i}", max_tokens=2, ignore_eos=True) for i in range(2)]
    long = [chat_line(stack, f"long-{i}", max_tokens=3000, ignore_eos=True) for i in range(6)]
    batch_id = submit(stack, short + long)
    wait_until(stack, batch_id, lambda batch: batch.request_counts.completed >= 2, timeout_s=60)
    cancelled_at = time.monotonic()
    assert client_for(stack).batches.cancel(batch_id).status in ("cancelling", "cancelled")
    batch = wait_for_end(stack, batch_id, timeout_s=60)
    assert time.monotonic() - cancelled_at < 15
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (8, 2, 6)
    assert sorted(line["custom_id"] for line in read_jsonl(stack, batch.output_file_id)) == ["short-0", "short-1"]
    errors = read_jsonl(stack, batch.error_file_id)
    assert sorted(line["custom_id"] for line in errors) == [f"long-{i}" for i in range(6)]
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}


def test_batch_lines_refuse_streaming(stack: Stack) -> None:
    batch = wait_for_end(stack, submit(stack, [chat_line(stack, "s", stream=True)]))
    assert batch.status == "failed"
    assert json.loads(json.dumps(batch.errors.data[0].model_dump()))["param"] == "stream"  # type: ignore[union-attr]


def test_logprobs_in_a_batch_line_match_the_chat_endpoints_shape(stack: Stack) -> None:
    line = chat_line(stack, "lp", max_tokens=4, ignore_eos=True, logprobs=True, top_logprobs=2)
    batch = wait_for_end(stack, submit(stack, [line]))
    [output] = read_jsonl(stack, batch.output_file_id)
    content = output["response"]["body"]["choices"][0]["logprobs"]["content"]
    body = {name: value for name, value in line["body"].items() if name != "ignore_eos"}
    direct = client_for(stack).chat.completions.create(**body, extra_body={"ignore_eos": True})
    assert [entry["token"] for entry in content] == [entry.token for entry in direct.choices[0].logprobs.content]  # type: ignore[union-attr]
    assert all(len(entry["top_logprobs"]) == 2 and entry["logprob"] <= 0 for entry in content)


def test_a_line_with_n_choices_matches_the_endpoints_choices(stack: Stack) -> None:
    body = {"model": stack.config.model_name, "prompt": "once upon a time", "max_tokens": 10, "temperature": 1.2,
            "seed": 4, "n": 3}  # fmt: skip
    line = {"custom_id": "three", "method": "POST", "url": "/v1/completions", "body": body}
    batch = wait_for_end(stack, submit(stack, [line], endpoint="/v1/completions"))
    assert batch.status == "completed", batch
    [output] = read_jsonl(stack, batch.output_file_id)
    choices = output["response"]["body"]["choices"]
    direct = client_for(stack).completions.create(**body)
    assert [choice["index"] for choice in choices] == [0, 1, 2]
    assert [choice["text"] for choice in choices] == [choice.text for choice in direct.choices]
    assert output["response"]["body"]["usage"]["completion_tokens"] == direct.usage.completion_tokens
