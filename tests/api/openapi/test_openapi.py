"""The published contract in the api alone, on a real SQLite database and Redis: /openapi.json covers every route of
the app (so the document cannot go stale), is valid OpenAPI 3.1 with pydantic's schemas, gives every error response
OpenAI's shape; /openapi.json and /docs are served without a key, and /docs loads nothing from elsewhere."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import CONTENT_TYPE_LATEST
from schemathesis.specs.openapi.definitions import OPENAPI_31

from api.app import create_app
from api.chat.schemas import ChatCompletionRequest
from api.openapi.document import REF_TEMPLATE, openapi_path
from api.openapi.routes import OPERATIONS
from tasks.store.api_keys import Scope, create_key
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tests.conftest import make_test_config

# Flask's static files (none are shipped), the document itself and its Swagger UI page and assets.
UNDOCUMENTED_ENDPOINTS = {"static", "openapi.document", "swagger_ui.show"}
ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
ANTHROPIC_ERROR_REF = {"$ref": "#/components/schemas/AnthropicErrorResponse"}
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")  # Anthropic's Messages API: errors in its shape
PUBLIC_PATHS = ("/health", "/health/ready")  # the probes; the document and /docs are not in it


@pytest.fixture
def app(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[Flask]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = make_test_config(tiny_model_dir, redis_url, database_url)
    with make_session_factory(make_db_engine(database_url))() as session:
        create_key(session, "someone", "default", Scope.USER)  # a key exists: no open mode
    yield create_app(config)
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def document(client: FlaskClient) -> dict[str, Any]:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    return response.get_json()


def test_every_route_of_the_app_is_in_the_document(app: Flask, document: dict[str, Any]) -> None:
    served = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint in UNDOCUMENTED_ENDPOINTS:
            continue
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            served.add((method.lower(), openapi_path(rule)))
    documented = {(method, path) for path, item in document["paths"].items() for method in item}
    assert served == documented
    assert set(OPERATIONS) <= {rule.endpoint for rule in app.url_map.iter_rules()}  # no entry for a removed route
    assert len(served) >= 24


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(OPENAPI_31).validate(document)
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    assert document["openapi"] == "3.1.0"
    assert document["components"]["securitySchemes"] == {
        "bearerAuth": {"type": "http", "scheme": "bearer"},
        "apiKeyAuth": {"type": "apiKey", "in": "header", "name": "x-api-key"},
    }
    assert document["security"] == [{"bearerAuth": []}, {"apiKeyAuth": []}]  # either one


def test_request_schemas_are_pydantics_own(document: dict[str, Any]) -> None:
    """Generated from the models that validate the bodies, not written by hand: a field added to a model is in the
    document."""
    generated = ChatCompletionRequest.model_json_schema(ref_template=REF_TEMPLATE)
    generated.pop("$defs")
    assert document["components"]["schemas"]["ChatCompletionRequest"] == generated
    chat = document["paths"]["/v1/chat/completions"]["post"]
    body_schema = chat["requestBody"]["content"]["application/json"]["schema"]
    assert body_schema == {"$ref": "#/components/schemas/ChatCompletionRequest"}
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}


def test_every_error_is_openai_shaped_and_every_route_but_health_needs_a_key(document: dict[str, Any]) -> None:
    """OpenAI's shape everywhere but the Messages API's routes, which answer in Anthropic's (except what gunicorn
    answers before the app sees the request)."""
    error = document["components"]["schemas"]["ErrorBody"]
    assert set(error["required"]) == {"message", "type", "param", "code"}
    assert set(document["components"]["schemas"]["AnthropicErrorResponse"]["required"]) == {"type", "error"}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            codes = {int(code) for code in operation["responses"]}
            assert {200, 400, 500, 503} <= codes, (method, path)
            for code, response in operation["responses"].items():
                if int(code) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert set(response["content"]) == {"application/json"}, (method, path, code)
                    is_anthropic = path in ANTHROPIC_PATHS and int(code) not in (414, 431)
                    expected = ANTHROPIC_ERROR_REF if is_anthropic else ERROR_REF
                    assert expected in (schema, *schema.get("anyOf", ())), (method, path, code)
            is_public = path in PUBLIC_PATHS
            assert operation.get("security") == ([] if is_public else None), (method, path)
            assert (401 in codes) is not is_public, (method, path)
            for name in re.findall(r"{(\w+)}", path):
                assert {"name": name, "in": "path", "required": True, "schema": {"type": "string"}} in operation[
                    "parameters"
                ]


def test_examples_are_valid_requests_for_the_served_model(app: Flask, document: dict[str, Any]) -> None:
    model_name = app.extensions["steerbatch"].model_info.name
    chat = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert ChatCompletionRequest.model_validate(chat["example"]).model == model_name
    for endpoint, operation in OPERATIONS.items():
        if operation.example is not None:
            assert operation.body is not None, endpoint
            operation.body.model_validate(operation.example(model_name))


def test_contract_is_served_without_a_key_and_docs_load_only_local_assets(client: FlaskClient) -> None:
    assert client.get("/v1/models").status_code == 401  # a key exists, so the api is not open
    assert client.get("/openapi.json").status_code == 200
    for page in ("/docs", "/docs/"):
        response = client.get(page)
        assert response.status_code == 200 and response.mimetype == "text/html"
        html = response.get_data(as_text=True)
        absolute = re.findall(r"https?://[^\"' ]+", html)  # Swagger UI's OAuth redirect: our own host
        assert all(url.startswith("http://localhost/docs/") for url in absolute), absolute
        assets = re.findall(r'(?:src|href)="([^"]+)"', html)
        assert len(assets) >= 4 and all(asset.startswith("/docs/") for asset in assets), assets
        for asset in assets:
            assert client.get(asset).status_code == 200, asset
    assert '"url": "/openapi.json"' in client.get("/docs").get_data(as_text=True)
    assert client.get("/docs/no-such-asset.js").get_json()["error"]["code"] == "not_found"


def test_a_routes_own_unavailable_body_and_typed_event_streams(document: dict[str, Any]) -> None:
    """/health/ready's 503 is its own body (with OpenAI's error in it) or the common error; the Responses API's stream
    is typed events that end with the terminal event, chat's stream chunks that end with [DONE]."""
    paths = document["paths"]
    not_ready = paths["/health/ready"]["get"]["responses"]["503"]["content"]["application/json"]["schema"]
    assert not_ready == {"anyOf": [{"$ref": "#/components/schemas/NotReady"}, ERROR_REF]}
    assert "error" in document["components"]["schemas"]["NotReady"]["required"]
    responses_data = paths["/v1/responses"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    typed = responses_data["properties"]["data"]
    assert typed["contentMediaType"] == "application/json"  # never the closing [DONE]
    assert {"$ref": "#/components/schemas/ResponseLifecycleEvent"} in typed["contentSchema"]["anyOf"]
    chat_data = paths["/v1/chat/completions"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    assert {"const": "[DONE]"} in chat_data["properties"]["data"]["anyOf"]
    metrics = paths["/metrics"]["get"]["responses"]
    assert set(metrics["200"]["content"]) == {CONTENT_TYPE_LATEST} and "403" in metrics
