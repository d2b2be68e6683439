"""A constrained row (response_format json_schema) with per-request SAE steering and monitoring, in one request and in
one batch beside unconstrained rows: the grammar holds however hard the steering pushes, the reports come back, and
the rows beside it get what they get alone."""

from __future__ import annotations

import json

import jsonschema

from scripts.stack import Stack
from tests.service.batch_helpers import chat_line, read_jsonl, submit, wait_for_end
from tests.service.steering.test_steering import MAX_TOKENS, QUESTION, SAE_ID, blue, chat, served, text  # noqa: F401

COLOR = {
    "type": "object",
    "properties": {"color": {"type": "string", "maxLength": 12}, "sure": {"type": "boolean"}},
    "required": ["color", "sure"],
}
CONSTRAINED = {
    "response_format": {"type": "json_schema", "json_schema": {"name": "color", "schema": COLOR, "strict": True}},
    "max_tokens": 120,
}
MONITOR = {"sae_id": SAE_ID, "top_k": 2, "positions": "all"}


def steering_toward(feature: dict) -> dict:
    return {"sae_id": SAE_ID, "features": [{"index": feature["index"], "strength": feature["strength"]}]}


def assert_constrained(reply: dict) -> None:
    """The reply is one JSON value of COLOR, finished by the grammar rather than the token budget."""
    assert reply["choices"][0]["finish_reason"] == "stop", reply["choices"][0]
    jsonschema.validate(json.loads(text(reply)), COLOR)


def assert_monitored(reply: dict) -> None:
    """One top-2 entry per position the model read: the prompt and every completion token but the last."""
    usage = reply["usage"]
    positions = [entry["position"] for entry in reply["monitor"]["tokens"]]
    assert positions == list(range(usage["prompt_tokens"] + usage["completion_tokens"] - 1))
    assert all(len(entry["features"]) == 2 for entry in reply["monitor"]["tokens"])


def test_a_constrained_request_is_steered_and_monitored(served: Stack, blue: dict) -> None:  # noqa: F811
    steering = steering_toward(blue)
    constrained = chat(served, **CONSTRAINED)
    monitored = chat(served, **CONSTRAINED, monitor=MONITOR)
    both = chat(served, **CONSTRAINED, steering=steering, monitor=MONITOR)
    hardest = chat(
        served, **CONSTRAINED, steering={**steering, "features": [{**steering["features"][0], "strength": 1000.0}]}
    )

    for reply in (constrained, monitored, both, hardest):
        assert_constrained(reply)
    assert text(monitored) == text(constrained), "monitoring changed the constrained reply"
    assert_monitored(monitored)
    assert_monitored(both)
    assert both["steering"] == {**steering, "vectors": [], "source": "request"}
    assert hardest["steering"]["features"][0]["strength"] == 1000.0


def test_a_batch_mixes_constrained_steered_and_monitored_rows(served: Stack, blue: dict) -> None:  # noqa: F811
    steering = steering_toward(blue)
    rows = {
        "constrained-steered-monitored": {**CONSTRAINED, "steering": steering, "monitor": MONITOR},
        "constrained": CONSTRAINED,
        "plain": {},
        "steered": {"steering": steering},
        "monitored": {"monitor": MONITOR},
    }
    body = {"messages": QUESTION, "max_tokens": MAX_TOKENS, "temperature": 0}
    lines = [chat_line(served, custom_id, **{**body, **extra}) for custom_id, extra in rows.items()]
    batch = wait_for_end(served, submit(served, lines))
    assert batch.status == "completed" and batch.request_counts.completed == len(rows), batch
    replies = {line["custom_id"]: line["response"]["body"] for line in read_jsonl(served, batch.output_file_id)}

    for custom_id, extra in rows.items():
        alone = chat(served, **extra)
        assert text(replies[custom_id]) == text(alone), f"{custom_id}: the batch row differs from the request alone"
        if "response_format" in extra:
            assert_constrained(replies[custom_id])
        if "monitor" in extra:
            assert_monitored(replies[custom_id])
        assert ("steering" in replies[custom_id]) == ("steering" in extra), custom_id
    assert text(replies["steered"]).lstrip().startswith(blue["token"].strip()), text(replies["steered"])
    assert "monitor" not in replies["plain"] and "steering" not in replies["plain"]
