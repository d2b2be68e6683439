"""Tenants through real HTTP and a real worker: one tenant cannot list, stream, cancel or delete another's objects,
nor start a batch from another's file, and Idempotency-Keys are per tenant."""

from __future__ import annotations

import json

import pytest
import requests

from scripts.stack import Stack
from tests.service.batch_helpers import chat_line, submit, wait_for_end
from tests.service.conftest import TenantKeys
from tests.service.http import auth, bearer
from tests.service.sse import data_frames, read_frames

pytestmark = pytest.mark.postgres  # on both databases: who owns what is a SQL filter


def listed_batches(stack: Stack, headers: dict[str, str]) -> set[str]:
    reply = requests.get(f"{stack.base_url}/v1/batches?limit=100", headers=headers, timeout=10)
    return {batch["id"] for batch in reply.json()["data"]}


def upload(stack: Stack, key: str, content: bytes, idempotency_key: str | None = None) -> requests.Response:
    headers = {**bearer(key), **({"Idempotency-Key": idempotency_key} if idempotency_key else {})}
    files = {"file": ("input.jsonl", content)}
    return requests.post(f"{stack.base_url}/v1/files", data={"purpose": "batch"}, files=files, headers=headers)


def test_the_batch_list_and_output_show_only_ones_own(stack: Stack, tenant_keys: TenantKeys) -> None:
    batch_id = submit(stack, [chat_line(stack, "mine", max_tokens=2)], key=tenant_keys.a)
    assert batch_id in listed_batches(stack, bearer(tenant_keys.a))
    assert batch_id not in listed_batches(stack, bearer(tenant_keys.b))
    assert batch_id not in listed_batches(stack, auth(stack))  # admin scope is not another tenant's view
    batch = wait_for_end(stack, batch_id, key=tenant_keys.a)
    assert batch.status == "completed"
    output = f"{stack.base_url}/v1/files/{batch.output_file_id}/content"  # the batch's tenant owns its output too
    assert requests.get(output, headers=bearer(tenant_keys.a), timeout=10).status_code == 200
    assert requests.get(output, headers=bearer(tenant_keys.b), timeout=10).status_code == 404


def test_a_batch_cannot_start_from_another_tenants_file(stack: Stack, tenant_keys: TenantKeys) -> None:
    file_id = upload(stack, tenant_keys.a, (json.dumps(chat_line(stack, "x")) + "\n").encode()).json()["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    as_b = requests.post(f"{stack.base_url}/v1/batches", json=body, headers=bearer(tenant_keys.b), timeout=30)
    assert as_b.status_code == 404 and as_b.json()["error"]["code"] == "not_found"


def test_idempotency_keys_are_per_tenant(stack: Stack, tenant_keys: TenantKeys) -> None:
    first_a = upload(stack, tenant_keys.a, b"{}\n", "shared-key").json()
    first_b = upload(stack, tenant_keys.b, b"[]\n", "shared-key")
    assert first_b.status_code == 200 and first_b.json()["id"] != first_a["id"]
    assert upload(stack, tenant_keys.a, b"{}\n", "shared-key").json()["id"] == first_a["id"]
    assert upload(stack, tenant_keys.a, b"[]\n", "shared-key").status_code == 409
    content = requests.get(f"{stack.base_url}/v1/files/{first_b.json()['id']}/content", headers=bearer(tenant_keys.b))
    assert content.content == b"[]\n"


def test_another_tenant_can_neither_stream_nor_cancel_a_running_request(stack: Stack, tenant_keys: TenantKeys) -> None:
    body = {"model": stack.config.model_name, "messages": [{"role": "user", "content": "tell me about cats"}],
            "max_tokens": 48, "ignore_eos": True, "temperature": 0, "stream": True}  # fmt: skip
    url = f"{stack.base_url}/v1/chat/completions"
    with requests.post(url, json=body, headers=bearer(tenant_keys.a), stream=True, timeout=120) as response:
        frames = read_frames(response)
        request_id = next(frame for frame in frames if frame.data is not None).json["id"]
        base = f"{stack.base_url}/v1/requests/{request_id}"
        assert requests.post(f"{base}/cancel", headers=bearer(tenant_keys.b), timeout=10).status_code == 404
        assert requests.get(f"{base}/events", headers=bearer(tenant_keys.b), timeout=10).status_code == 404
        rest = data_frames(list(frames))
    assert rest[-1].data == "[DONE]"
    finish_reasons = [chunk["choices"][0]["finish_reason"] for chunk in (f.json for f in rest[:-1]) if chunk["choices"]]
    assert finish_reasons[-1] == "length"  # ran to its end: B's cancel touched nothing


def test_another_tenant_cannot_delete_a_file(stack: Stack, tenant_keys: TenantKeys) -> None:
    file_id = upload(stack, tenant_keys.a, b'{"kept": true}\n').json()["id"]
    url = f"{stack.base_url}/v1/files/{file_id}"
    assert requests.delete(url, headers=bearer(tenant_keys.b), timeout=10).status_code == 404
    assert requests.get(f"{url}/content", headers=bearer(tenant_keys.a), timeout=10).content == b'{"kept": true}\n'
    assert requests.delete(url, headers=bearer(tenant_keys.a), timeout=10).status_code == 200
