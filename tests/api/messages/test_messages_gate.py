"""What every generation passes, on /v1/messages, on a real Redis and SQLite: the admission gate's 429 and the 503 of
a model with no live worker come in Anthropic's error shape and record nothing; count_tokens needs no worker."""

from __future__ import annotations

from api.gate.admission_hooks import GATED_ENDPOINTS
from tests.api.gate import test_admission
from tests.api.gate.test_admission import num_requests

make_client = test_admission.make_client  # the admission tests' fixture: an app on a real Redis and SQLite
BODY = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
WAIT_S = 0.2


def test_no_free_slot_is_anthropics_rate_limit_error(make_client) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(admission_slots=1, admission_wait_s=WAIT_S)
    assert "messages.create" in GATED_ENDPOINTS
    gate = client.application.extensions["steerbatch"].admission_gate
    held_since = gate.acquire()  # another admission holds the only slot
    assert held_since is not None
    try:
        refused = client.post("/v1/messages", json=BODY)
    finally:
        gate.release(held_since)
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
    body = refused.get_json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert "retry" in body["error"]["message"]
    assert num_requests(config) == 0


def test_no_live_worker_is_anthropics_overloaded_error_and_count_tokens_needs_none(make_client) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(live_worker=False)
    refused = client.post("/v1/messages", json=BODY)
    assert refused.status_code == 503 and refused.get_json()["error"]["type"] == "overloaded_error"
    assert num_requests(config) == 0
    counted = client.post("/v1/messages/count_tokens", json={"model": "tiny", "messages": BODY["messages"]})
    tokenizer = client.application.extensions["steerbatch"].model_info.tokenizer
    expected = tokenizer.apply_chat_template(BODY["messages"], add_generation_prompt=True, tokenize=False)
    assert counted.get_json() == {"input_tokens": len(tokenizer.encode(expected, add_special_tokens=False))}
