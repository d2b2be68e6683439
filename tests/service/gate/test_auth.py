"""Every /v1 route against every kind of caller, on SQLite and PostgreSQL: no key, a bad key and a revoked key get
401 in OpenAI's shape; another tenant gets the same 404 a missing object gets; a user key may not change what every
tenant gets (403); the owner and the admin are served. The openai client raises AuthenticationError on a wrong key."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import openai
import pytest
import requests
from openai import OpenAI

from scripts.stack import Stack
from tests.service.batch_helpers import chat_line, wait_for_end
from tests.service.conftest import TenantKeys
from tests.service.http import bearer

OBJECT, OPEN, ADMIN = "object", "open", "admin"  # owned by tenant a | any key | admin keys only (to change)
ROUTES = [
    ("POST", "/v1/chat/completions", OPEN),
    ("POST", "/v1/completions", OPEN),
    ("GET", "/v1/models", OPEN),
    ("GET", "/v1/models/{model}", OPEN),
    ("GET", "/v1/requests/{request}", OBJECT),
    ("GET", "/v1/requests/{request}/events", OBJECT),
    ("POST", "/v1/requests/{request}/cancel", OBJECT),
    ("POST", "/v1/files", OPEN),
    ("GET", "/v1/files/{file}", OBJECT),
    ("GET", "/v1/files/{file}/content", OBJECT),
    ("DELETE", "/v1/files/{file}", OBJECT),
    ("POST", "/v1/batches", OPEN),
    ("GET", "/v1/batches", OPEN),
    ("GET", "/v1/batches/{batch}", OBJECT),
    ("POST", "/v1/batches/{batch}/cancel", OBJECT),
    ("GET", "/v1/batches/{batch}/events", OBJECT),
    ("GET", "/v1/saes", OPEN),
    ("GET", "/v1/steering/profile", OPEN),
    ("PUT", "/v1/steering/profile", OPEN),  # a user key's own tenant's profile
    ("DELETE", "/v1/steering/profile", OPEN),
    ("GET", "/v1/steering/profile?scope=worker", OPEN),
    ("PUT", "/v1/steering/profile?scope=worker", ADMIN),
    ("DELETE", "/v1/steering/profile?scope=worker", ADMIN),
    ("GET", "/v1/monitor", OPEN),
    ("PUT", "/v1/monitor", ADMIN),
    ("DELETE", "/v1/monitor", ADMIN),
]
UNAUTHENTICATED = ("no key", "bad key", "revoked key")


def _cases() -> list[tuple[str, str, str, int]]:
    cases = [(method, path, caller, 401) for method, path, _ in ROUTES for caller in UNAUTHENTICATED]
    cases += [(method, path, "other tenant", 404) for method, path, kind in ROUTES if kind == OBJECT]
    cases += [(method, path, "user key", 403) for method, path, kind in ROUTES if kind == ADMIN]
    # the owner is served wherever calling twice changes nothing, so the refusals above are refusals of someone
    cases += [
        (method, path, "owner", 200)
        for method, path, kind in ROUTES
        if kind != ADMIN and (method == "GET" or path.endswith("/cancel"))
    ]
    return cases


@dataclass(frozen=True)
class Owned:
    """Tenant a's objects, all finished: a request, an uploaded file, and a batch run from it."""

    ids: dict[str, str]

    def url(self, stack: Stack, path: str) -> str:
        return stack.base_url + path.format(**self.ids)


@pytest.fixture(scope="session")
def owned(stack: Stack, tenant_keys: TenantKeys) -> Owned:
    headers = bearer(tenant_keys.a)
    body = {"model": stack.config.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    reply = requests.post(f"{stack.base_url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    content = (json.dumps(chat_line(stack, "only", max_tokens=2)) + "\n").encode()
    file_id = _upload(stack, headers, content).json()["id"]
    batch = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    batch_id = requests.post(f"{stack.base_url}/v1/batches", json=batch, headers=headers, timeout=60).json()["id"]
    wait_for_end(stack, batch_id, key=tenant_keys.a)
    return Owned({"request": reply.json()["id"], "file": file_id, "batch": batch_id, "model": stack.config.model_name})


def _upload(stack: Stack, headers: dict[str, str], content: bytes) -> requests.Response:
    files = {"file": ("input.jsonl", content)}
    return requests.post(f"{stack.base_url}/v1/files", data={"purpose": "batch"}, files=files, headers=headers)


def _headers(caller: str, keys: TenantKeys) -> dict[str, str]:
    return {
        "no key": {},
        "bad key": bearer(f"sb-{uuid.uuid4().hex}"),
        "revoked key": bearer(keys.revoked),
        "other tenant": bearer(keys.b),
        "user key": bearer(keys.a),
        "owner": bearer(keys.a),
    }[caller]


@pytest.mark.parametrize(("method", "path", "caller", "status"), _cases())
def test_every_route_answers_every_caller(
    stack: Stack, tenant_keys: TenantKeys, owned: Owned, method: str, path: str, caller: str, status: int
) -> None:
    url = owned.url(stack, path)
    response = requests.request(method, url, json={}, headers=_headers(caller, tenant_keys), timeout=60)
    assert response.status_code == status, response.text
    if status == 401:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
        assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, "invalid_api_key")
    elif status == 403:
        assert response.json()["error"]["code"] == "insufficient_permissions"
    elif status == 404:  # exactly what a missing object of the owner's gets: nothing says it exists
        missing = _as_missing(stack, owned, path, bearer(tenant_keys.a), method)
        assert response.json() == missing


def _as_missing(stack: Stack, owned: Owned, path: str, headers: dict[str, str], method: str) -> dict:
    """The answer for the same route on an id nobody has, with that id put back where the real one was."""
    real = next(value for name, value in owned.ids.items() if "{" + name + "}" in path)
    fake = real[:-8] + "00000000"
    response = requests.request(method, owned.url(stack, path).replace(real, fake), json={}, headers=headers)
    assert response.status_code == 404
    return json.loads(response.text.replace(fake, real))


def test_the_openai_client_raises_authentication_error_on_a_wrong_key(stack: Stack) -> None:
    client = OpenAI(base_url=f"{stack.base_url}/v1", api_key="sb-not-a-key", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    with pytest.raises(openai.AuthenticationError) as raised:
        client.chat.completions.create(model=stack.config.model_name, messages=[{"role": "user", "content": "hi"}])
    assert raised.value.code == "invalid_api_key"
    right = OpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key, max_retries=0, timeout=30)
    assert right.models.list().data[0].id == stack.config.model_name


def test_health_needs_no_key(stack: Stack) -> None:
    assert requests.get(f"{stack.base_url}/health", timeout=10).status_code == 200


def test_no_key_reaches_the_logs_and_key_names_do(stack: Stack, tenant_keys: TenantKeys, owned: Owned) -> None:
    assert stack.log_dir is not None
    logs = "".join(path.read_text(errors="replace") for path in stack.log_dir.glob("*.log"))
    for key in (stack.api_key, tenant_keys.a, tenant_keys.b, tenant_keys.revoked):
        assert key and key not in logs and key.removeprefix("sb-")[:16] not in logs
    assert f"{owned.ids['request']} from key tenant-a (tenant a)" in logs
