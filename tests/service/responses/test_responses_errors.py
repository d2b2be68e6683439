"""The Responses API refuses bad input with OpenAI-shaped 400s naming the field, accepts the harmless fields it
ignores, and shows a tenant's responses to no other tenant."""

from __future__ import annotations

import pytest
import requests

from scripts.stack import Stack
from tests.service.conftest import TenantKeys
from tests.service.http import auth, bearer

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "parameters": CITY}
BAD_BODIES = [
    ({"colour": "blue"}, "colour"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"role": "narrator", "content": "x"}]}, "input.0.message.role"),
    ({"input": [{"role": "user", "content": "x", "bogus": 1}], "include": ["bogus"]}, "include.0"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input.0.message.content.0"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input.0.function_call.arguments"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.function_call_output.call_id"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 10**9}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"metadata": {"k": 1}}, "metadata.k"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"truncation": "auto"}, "truncation"),
    ({"background": True, "store": False}, "background"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "name": "nowhere"}, "tools": [WEATHER_TOOL]}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools.0.name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "nonsense"}}]}, "tools.0.parameters"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}}, "text.format.schema"),
    ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": CITY}}, "tools": [WEATHER_TOOL],
      "tool_choice": "required"}, "tool_choice"),
    ({"model": "not-served"}, "model"),
    ({"previous_response_id": "resp_missing"}, "previous_response_id"),
]  # fmt: skip


def post(stack: Stack, body: dict, headers: dict[str, str] | None = None) -> requests.Response:
    full = {"model": stack.config.model_name, "input": "hi", "max_output_tokens": 4, **body}
    return requests.post(f"{stack.base_url}/v1/responses", json=full, headers=headers or auth(stack), timeout=120)


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
def test_bad_input_is_refused_naming_the_field(stack: Stack, body: dict, param: str) -> None:
    reply = post(stack, body)
    error = reply.json()["error"]
    expected = 404 if param in ("previous_response_id", "model") else 400  # not found, as OpenAI answers
    assert (reply.status_code, error["param"]) == (expected, param), error
    assert error["type"] == "invalid_request_error" and error["message"]


def test_harmless_fields_are_accepted(stack: Stack) -> None:
    body = {"user": "u-1", "parallel_tool_calls": False, "truncation": "disabled", "reasoning": {"effort": "low"},
            "metadata": {"k": "v"}}  # fmt: skip
    reply = post(stack, body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["metadata"] == {"k": "v"} and reply.json()["user"] == "u-1"


def test_bad_retrieval_arguments(stack: Stack) -> None:
    response_id = post(stack, {}).json()["id"]
    base = f"{stack.base_url}/v1/responses/{response_id}"
    bad_queries = (
        ("stream=maybe", "stream"),
        ("stream=true&starting_after=-1", "starting_after"),
        ("stream=true&starting_after=%C2%B2", "starting_after"),  # "²": a digit to str.isdigit, not to int()
        ("starting_after=x", "starting_after"),  # refused even where it would not be used
    )
    for query, param in bad_queries:
        reply = requests.get(f"{base}?{query}", headers=auth(stack), timeout=30)
        assert (reply.status_code, reply.json()["error"]["param"]) == (400, param)
    header = requests.get(base, headers={**auth(stack), "Last-Event-ID": "x"}, timeout=30)
    assert (header.status_code, header.json()["error"]["param"]) == (400, "Last-Event-ID")
    cancel = requests.post(f"{base}/cancel", headers=auth(stack), timeout=30)  # not a background response
    assert (cancel.status_code, cancel.json()["error"]["param"]) == (400, "response_id")
    missing = requests.get(f"{stack.base_url}/v1/responses/resp_missing", headers=auth(stack), timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_another_tenant_sees_none_of_a_tenants_responses(stack: Stack, tenant_keys: TenantKeys) -> None:
    as_a, as_b = bearer(tenant_keys.a), bearer(tenant_keys.b)
    response_id = post(stack, {"background": True}, as_a).json()["id"]
    base = f"{stack.base_url}/v1/responses/{response_id}"
    assert requests.get(base, headers=as_b, timeout=30).status_code == 404
    assert requests.get(f"{base}?stream=true", headers=as_b, timeout=30).status_code == 404
    assert requests.post(f"{base}/cancel", headers=as_b, timeout=30).status_code == 404
    assert requests.delete(base, headers=as_b, timeout=30).status_code == 404
    continued = post(stack, {"previous_response_id": response_id}, as_b)
    assert (continued.status_code, continued.json()["error"]["param"]) == (404, "previous_response_id")
    assert requests.get(base, headers=auth(stack), timeout=30).status_code == 404  # admin scope is not a's view
    assert requests.get(base, headers=as_a, timeout=30).json()["id"] == response_id
    assert requests.delete(base, headers=as_a, timeout=30).json() == {
        "id": response_id,
        "object": "response",
        "deleted": True,
    }
    assert requests.get(base, headers=as_a, timeout=30).status_code == 404
