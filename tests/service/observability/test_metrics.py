"""/metrics and /health/ready against the running stack: the worker's counters move as requests run, an admin key
reads them, and readiness drops a killed worker within two leases."""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from scripts.stack import Stack
from tests.service.conftest import TenantKeys
from tests.service.http import auth, bearer
from tests.service.sse import read_frames
from tests.service.steering.test_steering import SAE_ID, served  # noqa: F401 (the fixture: the stack once it lists the SAE)

NUM_REQUESTS = 3
TTFT_COUNT = "steerbatch:time_to_first_token_seconds_count"
E2E_COUNT = "steerbatch:e2e_request_latency_seconds_count"
PROMPT_TOKENS = "steerbatch:prompt_tokens_total"
GENERATION_TOKENS = "steerbatch:generation_tokens_total"
SPARE_LEASE_S = 1.5


def scrape(stack: Stack) -> list[Sample]:
    response = requests.get(f"{stack.base_url}/metrics", headers=auth(stack), timeout=10)
    assert response.status_code == 200, response.text
    return [sample for family in text_string_to_metric_families(response.text) for sample in family.samples]


def scrape_settled(stack: Stack) -> list[Sample]:
    """A scrape once every worker has published since now, so it counts every request that has already finished
    (workers publish with each lease renewal, every WORKER_LEASE_S / 3, not as requests end)."""
    since = time.time()

    def has_published() -> bool:
        ready = requests.get(f"{stack.base_url}/health/ready", timeout=10).json()
        workers = [worker for model in ready["models"].values() for worker in model["workers"]]
        return bool(workers) and all(time.time() - worker["heartbeat_age_s"] > since for worker in workers)

    wait_for(has_published, 2 * stack.config.worker_lease_s, "every worker published")
    return scrape(stack)


def total(samples: list[Sample], name: str) -> float:
    return sum(sample.value for sample in samples if sample.name == name)


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout_s:.0f} s")
        time.sleep(0.2)


def run_requests(stack: Stack) -> list[dict]:
    usages = []
    for i in range(NUM_REQUESTS):
        chat = i % 2 == 0
        body = {"model": stack.config.model_name, "max_tokens": 5 + i, "ignore_eos": True, "stream": i == 1}
        body |= {"messages": [{"role": "user", "content": f"hi {i}"}]} if chat else {"prompt": f"the cat {i}"}
        if i == 1:
            body["stream_options"] = {"include_usage": True}
        url = f"{stack.base_url}/v1/{'chat/completions' if chat else 'completions'}"
        response = requests.post(url, json=body, headers=auth(stack), timeout=120, stream=body["stream"])
        assert response.status_code == 200, response.text
        usages.append(_usage(response))
    return usages


def _usage(response: requests.Response) -> dict:
    if not response.headers["content-type"].startswith("text/event-stream"):
        return response.json()["usage"]
    chunks = [frame.json for frame in read_frames(response) if frame.data not in (None, "[DONE]")]
    return next(chunk["usage"] for chunk in reversed(chunks) if chunk.get("usage"))


def test_counters_move_as_requests_run(stack: Stack) -> None:
    before = scrape_settled(stack)
    usages = run_requests(stack)
    prompt = sum(usage["prompt_tokens"] for usage in usages)
    generated = sum(usage["completion_tokens"] for usage in usages)

    def delta(samples: list[Sample], name: str) -> float:
        return total(samples, name) - total(before, name)

    def published() -> bool:  # the worker publishes with each lease renewal, every WORKER_LEASE_S / 3
        after = scrape(stack)
        return delta(after, E2E_COUNT) >= NUM_REQUESTS and delta(after, GENERATION_TOKENS) >= generated

    wait_for(published, stack.config.worker_lease_s, "the worker published its requests")
    after = scrape(stack)
    assert delta(after, TTFT_COUNT) == NUM_REQUESTS
    assert delta(after, E2E_COUNT) == NUM_REQUESTS
    assert delta(after, PROMPT_TOKENS) == prompt
    assert delta(after, GENERATION_TOKENS) == generated
    lengths = [
        s for s in after if s.name == "steerbatch:request_success_total" and s.labels["finished_reason"] == "length"
    ]
    assert sum(s.value for s in lengths) >= NUM_REQUESTS
    assert all(s.labels["model_name"] == stack.config.model_name and s.labels["worker"] for s in lengths)
    kv = [s for s in after if s.name == "steerbatch:kv_cache_usage_perc"]
    assert kv and all(0 <= s.value <= 1 for s in kv)


def test_steered_and_monitored_rows_are_counted(served: Stack, steering_demo: dict) -> None:  # noqa: F811
    names = ("steerbatch:steered_rows_total", "steerbatch:monitored_rows_total")
    before = scrape_settled(served)
    feature = steering_demo["features"][0]
    steering = {"sae_id": SAE_ID, "features": [{"index": feature["index"], "strength": feature["strength"]}]}
    body = {"model": served.config.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for extra in ({"steering": steering, "n": 2}, {"monitor": {"sae_id": SAE_ID, "top_k": 1}},
                  {"steering": {"sae_id": SAE_ID, "features": []}}):  # fmt: skip
        response = requests.post(f"{served.base_url}/v1/chat/completions", json=body | extra, headers=auth(served),
                                 timeout=120)  # fmt: skip
        assert response.status_code == 200, response.text

    def counted() -> tuple[float, ...]:
        after = scrape(served)
        return tuple(total(after, name) - total(before, name) for name in names)

    wait_for(lambda: counted() == (2, 1), served.config.worker_lease_s, "two steered rows and one monitored")
    time.sleep(served.config.worker_lease_s / 3)  # the next publication: an explicitly empty spec steers nothing
    assert counted() == (2, 1)


def test_metrics_need_an_admin_key(stack: Stack, tenant_keys: TenantKeys) -> None:
    url = f"{stack.base_url}/metrics"
    assert requests.get(url, timeout=10).status_code == 401
    response = requests.get(url, headers=bearer(tenant_keys.a), timeout=10)
    assert response.status_code == 403 and response.json()["error"]["code"] == "insufficient_permissions"


def ready_workers(stack: Stack) -> list[str]:
    response = requests.get(f"{stack.base_url}/health/ready", timeout=10)
    model = response.json()["models"][stack.config.model_name]
    return [worker["name"] for worker in model["workers"]]


def test_ready_drops_a_killed_worker_within_two_leases(stack: Stack, tmp_path: Path) -> None:
    """A second worker of the model, with a short lease, joins the stack's and is killed; the stack's stays."""
    assert requests.get(f"{stack.base_url}/health/ready", timeout=10).status_code == 200
    [shared] = ready_workers(stack)
    spare = Stack(dataclasses.replace(stack.config, worker_lease_s=SPARE_LEASE_S), log_dir=tmp_path)
    spare.start_worker()
    try:
        wait_for(lambda: len(ready_workers(stack)) == 2, 180, "the spare worker was not ready")
        spare.process("worker").popen.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: ready_workers(stack) == [shared], 2 * SPARE_LEASE_S, "readiness still lists the killed worker")
        assert time.monotonic() - killed_at < 2 * SPARE_LEASE_S
    finally:
        spare.stop()
    assert requests.get(f"{stack.base_url}/health/ready", timeout=10).status_code == 200
