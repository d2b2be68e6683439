"""Admission on a real Redis and SQLite: no live worker is a fast 503, a full queue and a spent rate limit are 429s
with Retry-After, and none of them records anything; both are per served model; an admitted request carries the key's
x-ratelimit headers; and the admission gate: a generation request that cannot get one of ADMISSION_SLOTS within
ADMISSION_WAIT_S is a fast 429 `server_busy` that records nothing, other routes never wait on it, and every way a
view ends gives its slot back."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy
from flask.testing import FlaskClient

from api.app import create_app
from api.gate.admission_hooks import GATED_ENDPOINTS
from api.gate.admission_slots import AdmissionGate
from tasks.config import Config
from tasks.rate_limits import WINDOW_S
from tasks.store.db import upgrade_to_head
from tasks.streams.worker_leases import renew_worker_lease
from tests.conftest import make_test_config

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}


@pytest.fixture
def make_client(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator:
    configs: list[Config] = []

    def make(*, live_worker: bool = True, **overrides: object) -> tuple[Config, FlaskClient]:
        database_url = f"sqlite:///{tmp_path / f'db{len(configs)}.sqlite'}"
        upgrade_to_head(database_url)
        config = make_test_config(tiny_model_dir, redis_url, database_url, **overrides)
        configs.append(config)
        if live_worker:  # a lease and nothing consuming the queue: admitted requests stay queued
            renew_worker_lease(redis.Redis.from_url(redis_url), config, "idle-worker")
        return config, create_app(config).test_client()

    yield make
    client = redis.Redis.from_url(redis_url)
    for config in configs:
        for model in config.served_model_paths():
            client.delete(*config.for_model(model).worker_queues)
        for key in client.scan_iter(f"{config.redis_prefix}*"):
            client.delete(key)


def num_requests(config: Config) -> int:
    engine = sqlalchemy.create_engine(config.database_url)
    with engine.connect() as connection:
        return connection.execute(sqlalchemy.text("SELECT count(*) FROM requests")).scalar_one()


def test_no_live_worker_is_a_fast_503_that_records_nothing(make_client) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(live_worker=False)
    response = client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 503 and response.headers["Retry-After"]
    assert response.get_json()["error"]["code"] == "no_worker_available"
    assert num_requests(config) == 0


def test_a_full_queue_is_a_429_with_retry_after(make_client) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(max_queued_requests=2)
    open_streams = [client.post("/v1/chat/completions", json=BODY) for _ in range(2)]  # a dropped one cancels
    assert [response.status_code for response in open_streams] == [200, 200]
    refused = client.post("/v1/chat/completions", json=BODY)
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert refused.get_json()["error"] == {
        "message": refused.get_json()["error"]["message"],
        "type": "rate_limit_exceeded",
        "param": None,
        "code": "queue_full",
    }
    assert num_requests(config) == 2


def test_workers_and_queue_room_are_per_model(make_client, tiny_model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(served_models=f"tiny={tiny_model_dir},twin={tiny_model_dir}", max_queued_requests=1)
    twin = {**BODY, "model": "twin"}
    refused = client.post("/v1/chat/completions", json=twin)
    assert refused.status_code == 503 and refused.get_json()["error"]["code"] == "no_worker_available"
    assert refused.headers["Retry-After"] and num_requests(config) == 0
    open_streams = [client.post("/v1/chat/completions", json=BODY)]  # tiny has its (idle) worker; a dropped one cancels
    assert client.post("/v1/chat/completions", json=BODY).status_code == 429  # and its queue is full
    renew_worker_lease(redis.Redis.from_url(config.redis_url), config.for_model("twin"), "twin-worker")
    open_streams.append(client.post("/v1/chat/completions", json=twin))  # twin's own queue has room
    assert [response.status_code for response in open_streams] == [200, 200]
    queues = redis.Redis.from_url(config.redis_url)
    assert [queues.llen(config.interactive_queue_of(model)) for model in ("tiny", "twin")] == [1, 1]


def test_queued_tokens_cap_counts_prompt_tokens(make_client) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(max_queued_requests=0, max_queued_tokens=1)
    open_stream = client.post("/v1/chat/completions", json=BODY)
    assert open_stream.status_code == 200
    assert client.post("/v1/chat/completions", json=BODY).status_code == 429
    assert num_requests(config) == 1


def away_from_a_window_edge(margin_s: float = 5.0) -> None:
    """Waits out the end of the current one-minute budget window when it is near: a test whose requests straddled
    it would see the counts start again (it failed once that way)."""
    left_s = WINDOW_S - time.time() % WINDOW_S
    if left_s < margin_s:
        time.sleep(left_s + 0.1)


def test_a_keys_request_budget_is_a_429_with_openai_headers(make_client) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(rate_limit_rpm=2, rate_limit_tpm=10_000)
    away_from_a_window_edge()
    first = client.post("/v1/chat/completions", json=BODY)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-limit-tokens"] == "10000"
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    assert client.post("/v1/chat/completions", json=BODY).headers["x-ratelimit-remaining-requests"] == "0"
    refused = client.post("/v1/chat/completions", json=BODY)
    assert refused.status_code == 429 and 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.get_json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert num_requests(config) == 2


def test_a_keys_token_budget_refuses_what_would_exceed_it(make_client) -> None:  # type: ignore[no-untyped-def]
    _, client = make_client(rate_limit_tpm=30)
    big = {**BODY, "max_tokens": 40}  # prompt + max_tokens is over 30 on its own
    refused = client.post("/v1/chat/completions", json=big)
    assert refused.status_code == 429 and "tokens" in refused.get_json()["error"]["message"]
    assert client.post("/v1/chat/completions", json=BODY).status_code == 200, "a refused request is not charged"


WAIT_S = 0.2


def gate_of(client) -> AdmissionGate:  # type: ignore[no-untyped-def]
    return client.application.extensions["steerbatch"].admission_gate


def test_every_gated_endpoint_is_a_route(make_client) -> None:  # type: ignore[no-untyped-def]
    _config, client = make_client()
    endpoints = {rule.endpoint for rule in client.application.url_map.iter_rules()}
    assert endpoints >= GATED_ENDPOINTS


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_no_free_slot_is_a_fast_429_that_records_nothing(make_client, path: str) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(admission_slots=1, admission_wait_s=WAIT_S)
    gate = gate_of(client)
    held_since = gate.acquire()  # another admission holds the only slot
    assert held_since is not None
    try:
        started = time.perf_counter()
        refused = client.post(path, json=BODY)
        waited_s = time.perf_counter() - started
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert WAIT_S * 1000 <= int(refused.headers["retry-after-ms"]) <= 1000
        assert refused.get_json()["error"]["code"] == "server_busy"
        assert refused.get_json()["error"]["type"] == "rate_limit_exceeded"
        assert WAIT_S <= waited_s < WAIT_S + 1.0
        assert client.get("/v1/models").status_code == 200  # routes that admit nothing never wait on the gate
        assert client.get("/health").status_code == 200
    finally:
        gate.release(held_since)
    assert num_requests(config) == 0


def test_every_ending_gives_the_slot_back(make_client) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(admission_slots=1, admission_wait_s=WAIT_S)
    assert client.post("/v1/chat/completions", json={**BODY, "temperature": -1}).status_code == 400  # invalid
    assert client.post("/v1/chat/completions", json={**BODY, "model": "nope"}).status_code == 404  # unknown model
    assert client.post("/v1/chat/completions", data="x", content_type="text/plain").status_code == 400
    assert client.post("/v1/chat/completions", json=BODY, headers={"Authorization": "Bearer x"}).status_code in (
        200,
        401,
    )
    streams = [client.post("/v1/chat/completions", json=BODY) for _ in range(3)]  # each gives it back once enqueued
    assert [response.status_code for response in streams] == [200, 200, 200]
    assert num_requests(config) >= 3
    gate = gate_of(client)
    held_since = gate.acquire()  # the one slot is free again
    assert held_since is not None
    gate.release(held_since)


def test_a_burst_refused_together_is_told_to_come_back_spread_out() -> None:
    gate = AdmissionGate(slots=4, wait_s=0.5)
    hints = [gate.retry_after_s() for _ in range(8)]  # refused at (nearly) the same moment, with nobody in line
    assert 0.01 <= hints[0] < 0.1  # one admission's time: 0.05 s / 4 slots at first
    spacings = [later - earlier for earlier, later in itertools.pairwise(hints)]
    assert all(spacing > 0.005 for spacing in spacings)  # one admission's time apart (0.05 s / 4 slots at first)
    for _ in range(20):  # admissions that took 0.2 s each: the gate admits slower, so it spaces refusals wider
        acquired_at = gate.acquire()
        assert acquired_at is not None
        gate.release(acquired_at - 0.2)
    wider = [gate.retry_after_s() for _ in range(2)]
    assert wider[1] - wider[0] > 2 * spacings[0]


def test_a_burst_waits_in_line_and_what_could_not_drain_in_time_is_refused_at_once() -> None:
    """One slot held for 0.5 s and 50 callers at once: at the first measure (0.05 s an admission) a line of 40 drains
    within the 2 s wait, so 40 wait their turn and are admitted; the other 10 are refused at once, each told to come
    back after the one before it, once the line will have drained."""
    gate = AdmissionGate(slots=1, wait_s=2.0)
    held_since = gate.acquire()
    assert held_since is not None
    outcomes: list[tuple[bool, float, float | None]] = []

    def caller() -> None:
        started = time.monotonic()
        acquired_at = gate.acquire()
        hint = None if acquired_at is not None else gate.retry_after_s()
        outcomes.append((acquired_at is not None, time.monotonic() - started, hint))
        if acquired_at is not None:
            gate.release(acquired_at)

    callers = [threading.Thread(target=caller) for _ in range(50)]
    for thread in callers:
        thread.start()
    time.sleep(0.5)
    gate.release(held_since)
    for thread in callers:
        thread.join(10)
    admitted = [waited_s for is_admitted, waited_s, _ in outcomes if is_admitted]
    refused = [(waited_s, hint) for is_admitted, waited_s, hint in outcomes if not is_admitted]
    assert (len(admitted), len(refused)) == (40, 10)
    assert max(admitted) < 2.0 and max(waited_s for waited_s, _ in refused) < 0.3
    hints = sorted(hint for _, hint in refused)  # about 2 s (40 in line, 0.05 s each), then 0.05 s apart
    assert hints[0] > 1.0 and hints[-1] < 10 and all(b > a for a, b in itertools.pairwise(hints))
