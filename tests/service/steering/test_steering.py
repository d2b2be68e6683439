"""SAE steering and monitoring over real HTTP, through a real worker: the reply turns toward the constructed feature's
token, the response reports what ran, monitors return per-position top-k, and bad input is a 400 naming its field."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from scripts.stack import Stack
from tests.service.batch_helpers import chat_line, read_jsonl, submit, wait_for_end
from tests.service.conftest import TenantKeys
from tests.service.http import auth, bearer
from tests.service.sse import data_frames, read_frames

SAE_ID = "tiny/resid_post_2"
QUESTION = [{"role": "user", "content": "tell me about dogs"}]
MAX_TOKENS = 8


@pytest.fixture
def served(tiny_sae_root: Path, stack: Stack) -> Stack:
    """The stack, once its worker has listed the tiny SAE (built before the stack's first request needs it)."""
    deadline = time.monotonic() + 30
    while not any(sae["id"] == SAE_ID for sae in get(stack, "/v1/saes").json()["data"]):
        assert time.monotonic() < deadline, "the worker never listed the tiny SAE"
        time.sleep(0.5)
    return stack


@pytest.fixture
def blue(steering_demo: dict) -> dict:
    """Feature 0: steering with it makes " blue" the model's first choice."""
    return steering_demo["features"][0]


def get(stack: Stack, path: str) -> requests.Response:
    return requests.get(f"{stack.base_url}{path}", headers=auth(stack), timeout=30)


def send(stack: Stack, method: str, path: str, body: dict | None = None, **kwargs: object) -> requests.Response:
    headers = {**auth(stack), **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    return requests.request(method, f"{stack.base_url}{path}", json=body, headers=headers, timeout=120, **kwargs)  # type: ignore[arg-type]


def chat(stack: Stack, key: str | None = None, **extra: object) -> dict:
    """A greedy chat, with the stack's admin key or `key`."""
    body = {"model": stack.config.model_name, "messages": QUESTION, "max_tokens": MAX_TOKENS, "temperature": 0}
    headers = {} if key is None else bearer(key)
    response = send(stack, "POST", "/v1/chat/completions", {**body, **extra}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def text(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def test_get_saes_lists_the_tiny_sae(served: Stack) -> None:
    listing = next(sae for sae in get(served, "/v1/saes").json()["data"] if sae["id"] == SAE_ID)
    hidden_size = json.loads((Path(served.config.model) / "config.json").read_text())["hidden_size"]
    assert listing == {
        "id": SAE_ID,
        "hook_name": "blocks.2.hook_resid_post",
        "d_in": hidden_size,
        "d_sae": 512,
        "architecture": "standard",
        "object": "sae",
    }


def test_steering_turns_the_reply_toward_the_feature_and_says_so(served: Stack, blue: dict) -> None:
    plain = chat(served)
    steering = {"sae_id": SAE_ID, "features": [{"index": blue["index"], "strength": blue["strength"]}]}
    steered = chat(served, steering=steering)
    empty = chat(served, steering={"sae_id": SAE_ID, "features": []})

    assert not text(plain).lstrip().startswith(blue["token"].strip()) and "steering" not in plain
    assert text(steered).lstrip().startswith(blue["token"].strip()), text(steered)
    assert steered["steering"] == {**steering, "vectors": [], "source": "request"}
    assert text(empty) == text(plain)
    assert empty["steering"] == {"sae_id": SAE_ID, "features": [], "vectors": [], "source": "request"}
    stored = get(served, f"/v1/requests/{steered['id']}").json()["response"]
    assert stored["steering"] == steered["steering"]


def test_monitor_returns_top_k_per_position(served: Stack) -> None:
    reply = chat(served, monitor={"sae_id": SAE_ID, "top_k": 3, "positions": "all"})
    report = reply["monitor"]
    usage = reply["usage"]
    assert report["sae_id"] == SAE_ID and report["top_k"] == 3
    assert [entry["position"] for entry in report["tokens"]] == list(
        range(usage["prompt_tokens"] + usage["completion_tokens"] - 1)
    )
    for entry in report["tokens"]:
        values = [feature["value"] for feature in entry["features"]]
        assert len(values) == 3 and values == sorted(values, reverse=True) and isinstance(entry["token"], str)
    last = chat(served, monitor={"sae_id": SAE_ID, "top_k": 2, "features": [0, 1, 2], "positions": "last"})
    assert len(last["monitor"]["tokens"]) == 1


def test_a_stream_ends_with_a_chunk_carrying_the_reports(served: Stack, blue: dict) -> None:
    steering = {"sae_id": SAE_ID, "features": [{"index": blue["index"], "strength": 2000.0}]}
    body = {"model": served.config.model_name, "messages": QUESTION, "max_tokens": 4, "stream": True}
    body |= {"steering": steering, "monitor": {"sae_id": SAE_ID, "top_k": 1, "positions": "last"}}
    with send(served, "POST", "/v1/chat/completions", body, stream=True) as response:
        frames = data_frames(list(read_frames(response)))
    assert frames[-1].data == "[DONE]"
    reports = frames[-2].json
    assert reports["choices"] == []
    assert reports["steering"]["features"] == [{"index": blue["index"], "strength": 1000.0}]  # clamped
    assert len(reports["monitor"]["tokens"]) == 1


@pytest.fixture
def profile(served: Stack, blue: dict) -> Iterator[dict]:
    steering = {"sae_id": SAE_ID, "features": [{"index": blue["index"], "strength": blue["strength"]}]}
    response = send(served, "PUT", "/v1/steering/profile", steering)
    assert response.status_code == 200, response.text
    yield response.json()
    send(served, "DELETE", "/v1/steering/profile")


def test_the_profile_steers_requests_that_say_nothing(served: Stack, blue: dict, profile: dict) -> None:
    assert get(served, "/v1/steering/profile").json() == profile
    assert profile["profile"]["features"] == [{"index": blue["index"], "strength": blue["strength"]}]
    by_profile = chat(served)
    unsteered = chat(served, steering={"features": []})
    assert text(by_profile).lstrip().startswith(blue["token"].strip())
    assert by_profile["steering"]["source"] == "profile"
    assert not text(unsteered).lstrip().startswith(blue["token"].strip())
    assert unsteered["steering"]["source"] == "request"


@pytest.fixture
def tenant_a_profile(served: Stack, blue: dict, tenant_keys: TenantKeys) -> Iterator[dict]:
    """Tenant a's own profile, set with its user key (which writes its tenant's profile, not the worker-wide one)."""
    steering = {"sae_id": SAE_ID, "features": [{"index": blue["index"], "strength": blue["strength"]}]}
    response = send(served, "PUT", "/v1/steering/profile", steering, headers=bearer(tenant_keys.a))
    assert response.status_code == 200, response.text
    yield response.json()
    send(served, "DELETE", "/v1/steering/profile", headers=bearer(tenant_keys.a))


def test_a_tenants_own_profile_steers_only_its_own_requests(
    served: Stack, blue: dict, tenant_keys: TenantKeys, tenant_a_profile: dict
) -> None:
    assert (tenant_a_profile["scope"], tenant_a_profile["tenant"]) == ("tenant", "a")
    assert get(served, "/v1/steering/profile").json()["profile"] is None  # the worker-wide one is untouched
    steered, other = chat(served, tenant_keys.a), chat(served, tenant_keys.b)
    assert text(steered).lstrip().startswith(blue["token"].strip()), text(steered)
    assert steered["steering"]["source"] == "tenant_profile"
    assert "steering" not in other and text(other) == text(chat(served))
    batch_id = submit(
        served, [chat_line(served, "a-line", messages=QUESTION, max_tokens=MAX_TOKENS)], key=tenant_keys.a
    )
    batch = wait_for_end(served, batch_id, key=tenant_keys.a)
    [line] = read_jsonl(served, batch.output_file_id, key=tenant_keys.a)
    assert line["response"]["body"]["steering"]["source"] == "tenant_profile"


def test_a_tenants_own_profile_wins_over_the_worker_wide_one(
    served: Stack, tenant_keys: TenantKeys, tenant_a_profile: dict, profile: dict
) -> None:
    assert chat(served, tenant_keys.a)["steering"]["source"] == "tenant_profile"
    assert chat(served, tenant_keys.b)["steering"]["source"] == "profile"


def monitoring_workers(stack: Stack, settings: dict, min_count: int) -> list[dict]:
    """The workers whose monitor runs `settings` and has counted `min_count` tokens, once there are any."""
    deadline = time.monotonic() + 20
    while True:
        workers = [w for w in get(stack, "/v1/monitor").json()["workers"] if w["settings"] == settings]
        if any(w["count"] >= min_count for w in workers):
            return workers
        assert time.monotonic() < deadline, workers
        time.sleep(0.2)


def test_the_worker_monitor_counts_traffic(served: Stack) -> None:
    settings = send(served, "PUT", "/v1/monitor", {"sae_id": SAE_ID, "features": [0, 5]}).json()["settings"]
    try:
        monitoring_workers(served, settings, min_count=0)
        usage = chat(served)["usage"]
        num_read = usage["prompt_tokens"] + usage["completion_tokens"] - 1
        (worker,) = monitoring_workers(served, settings, min_count=num_read)
        assert worker["count"] == num_read
        assert [feature["index"] for feature in worker["features"]] == [0, 5]
    finally:
        send(served, "DELETE", "/v1/monitor")
    assert get(served, "/v1/monitor").json()["settings"] is None


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"steering": {"sae_id": "tiny/none", "features": [{"index": 0, "strength": 1}]}}, "steering.sae_id"),
        ({"steering": {"sae_id": SAE_ID, "features": [{"index": 512, "strength": 1}]}}, "steering.features.0.index"),
        ({"steering": {"sae_id": SAE_ID, "features": [{"index": -1, "strength": 1}]}}, "steering.features.0.index"),
        ({"steering": {"sae_id": SAE_ID, "features": [{"index": 3, "strength": 1}] * 2}}, "steering.features"),
        (
            {"steering": {"sae_id": SAE_ID, "features": [{"index": 3, "strength": math.inf}]}},
            "steering.features.0.strength",
        ),
        ({"steering": {"features": [{"index": 3, "strength": 1}]}}, "steering"),
        ({"steering": {"vectors": [{"layer": 0, "values": [1.0, 2.0]}]}}, "steering.vectors.0.values"),
        ({"steering": {"vectors": [{"layer": 40, "values": [1.0]}]}}, "steering.vectors.0.layer"),
        ({"monitor": {"sae_id": "tiny/none"}}, "monitor.sae_id"),
        ({"monitor": {"sae_id": SAE_ID, "features": [600]}}, "monitor.features.0"),
        ({"monitor": {"sae_id": SAE_ID, "top_k": 65}}, "monitor.top_k"),
        ({"monitor": {"sae_id": SAE_ID, "top_k": 64, "positions": "all"}, "max_tokens": 1000}, "monitor.positions"),
        ({"monitor": {"sae_id": SAE_ID, "positions": "middle"}}, "monitor.positions"),
    ],
)
def test_bad_steering_and_monitor_input_is_a_400_naming_the_field(served: Stack, extra: dict, param: str) -> None:
    body = {"model": served.config.model_name, "messages": QUESTION, "max_tokens": MAX_TOKENS, **extra}
    # json.dumps writes inf as Infinity, which the api's parser reads back as a float
    response = requests.post(
        f"{served.base_url}/v1/chat/completions",
        data=json.dumps(body),
        headers={**auth(served), "Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error


def test_batch_lines_report_their_steering_and_monitor(served: Stack, blue: dict) -> None:
    steering = {"sae_id": SAE_ID, "features": [{"index": blue["index"], "strength": blue["strength"]}]}
    monitor = {"sae_id": SAE_ID, "top_k": 2, "positions": "last"}
    base = {"messages": QUESTION, "max_tokens": MAX_TOKENS, "temperature": 0}
    lines = [
        chat_line(served, "steered", **base, steering=steering),
        chat_line(served, "monitored", **base, monitor=monitor),
        chat_line(served, "plain", **base),
    ]
    batch = wait_for_end(served, submit(served, lines))
    assert batch.status == "completed" and batch.request_counts.completed == 3
    bodies = {line["custom_id"]: line["response"]["body"] for line in read_jsonl(served, batch.output_file_id)}
    assert bodies["steered"]["steering"] == {**steering, "vectors": [], "source": "request"}
    assert text(bodies["steered"]).lstrip().startswith(blue["token"].strip())
    assert len(bodies["monitored"]["monitor"]["tokens"]) == 1
    assert "steering" not in bodies["plain"] and "monitor" not in bodies["plain"]
    assert text(bodies["plain"]) == text(chat(served))


def test_a_vector_file_the_worker_cannot_find_is_the_clients_400(served: Stack) -> None:
    """Only the worker can look for the file; its refusal still reaches the client as a request error."""
    body = {"model": served.config.model_name, "messages": QUESTION, "max_tokens": 4,
            "steering": {"vectors": [{"layer": 1, "path": "no/such/vector.safetensors", "strength": 1.0}]}}  # fmt: skip
    response = send(served, "POST", "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "vector" in error["message"]
