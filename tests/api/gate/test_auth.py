"""Authentication in the api alone, on a real SQLite database and Redis: open mode only while no key exists and
both ends are loopback, API_KEY as a static admin key, scopes, the tenant's own steering profile, and the exact
401 and 403 bodies."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from api.app import create_app
from api.gate.trusted_keys import KEY_TRUSTED_FOR_S
from tasks.config import Config
from tasks.steering_store import publish_saes, read_profile
from tasks.store.api_keys import ApiKeyRecord, Scope, create_key, revoke_key
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tests.conftest import make_test_config

SAE = {"id": "tiny/resid_post_2", "hook_name": "blocks.2.hook_resid_post", "d_in": 128, "d_sae": 512}
MISSING_KEY = {
    "error": {
        "message": "You didn't provide an API key. Send it as `Authorization: Bearer <key>`.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


@pytest.fixture
def config(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[Config]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = make_test_config(tiny_model_dir, redis_url, database_url)
    yield config
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def new_key(config: Config, name: str, tenant: str = "default", scope: Scope = Scope.USER) -> str:
    with make_session_factory(make_db_engine(config.database_url))() as session:
        return create_key(session, name, tenant, scope)


def revoke(config: Config, name: str) -> None:
    with make_session_factory(make_db_engine(config.database_url))() as session:
        assert revoke_key(session, name)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_open_mode_lasts_only_while_no_key_exists(config: Config) -> None:
    client = create_app(config).test_client()
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/models", headers=bearer("anything")).status_code == 200  # as vLLM without --api-key
    key = new_key(config, "first")
    missing = client.get("/v1/models")
    assert (missing.status_code, missing.get_json()) == (401, MISSING_KEY)
    assert client.get("/v1/models", headers=bearer(key)).status_code == 200
    assert client.get("/v1/models", headers={"Authorization": f"bearer  {key} "}).status_code == 200
    assert client.get("/v1/models", headers={"Authorization": f"Basic {key}"}).status_code == 401
    revoke(config, "first")
    assert client.get("/v1/models", headers=bearer(key)).status_code == 200  # open again: no key is left
    assert client.get("/health").status_code == 200


def test_a_revoked_key_is_refused_within_its_bound(config: Config) -> None:
    """A key's lookup is trusted for KEY_TRUSTED_FOR_S (api/gate/trusted_keys.py), no longer: once that has passed
    since its revocation, the key is refused, though it was served just before."""
    client = create_app(config).test_client()
    key = bearer(new_key(config, "soon-revoked"))
    new_key(config, "staying")  # so that the revocation does not open the api to any caller again
    assert client.get("/v1/models", headers=key).status_code == 200
    revoke(config, "soon-revoked")
    time.sleep(KEY_TRUSTED_FOR_S)
    assert client.get("/v1/models", headers=key).get_json()["error"]["code"] == "invalid_api_key"


def test_open_mode_never_serves_beyond_loopback(config: Config) -> None:
    remote = create_app(config).test_client()
    remote.environ_base["REMOTE_ADDR"] = "192.0.2.7"
    assert remote.get("/v1/models").get_json() == MISSING_KEY
    wide = create_app(dataclasses.replace(config, host="0.0.0.0")).test_client()
    assert wide.get("/v1/models").status_code == 401
    assert wide.get("/health").status_code == 200


def test_api_key_is_a_static_admin_key_of_the_default_tenant(config: Config) -> None:
    client = create_app(dataclasses.replace(config, api_key="sb-static-key-for-tests")).test_client()
    assert client.get("/v1/models").status_code == 401  # it exists, so nothing is open
    wrong = client.get("/v1/models", headers=bearer("sb-static-key-for-test"))
    assert wrong.get_json()["error"]["message"] == "Incorrect API key provided."
    assert client.delete("/v1/monitor", headers=bearer("sb-static-key-for-tests")).status_code == 200
    profile = client.get("/v1/steering/profile", headers=bearer("sb-static-key-for-tests")).get_json()
    assert (profile["scope"], profile["tenant"]) == ("worker", None)


def test_a_user_key_may_not_change_what_every_tenant_gets(config: Config) -> None:
    client = create_app(config).test_client()
    user = bearer(new_key(config, "user", "acme"))
    for method, path in (
        ("put", "/v1/monitor"),
        ("delete", "/v1/monitor"),
        ("delete", "/v1/steering/profile?scope=worker"),
    ):
        response = getattr(client, method)(path, json={"sae_id": SAE["id"]}, headers=user)
        assert response.status_code == 403
        error = response.get_json()["error"]
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error",
            None,
            "insufficient_permissions",
        )
    assert client.get("/v1/monitor", headers=user).status_code == 200
    assert client.get("/v1/steering/profile?scope=bogus", headers=user).get_json()["error"]["param"] == "scope"


def test_a_user_key_keeps_its_tenants_own_profile(config: Config) -> None:
    client = create_app(config).test_client()
    publish_saes(redis.Redis.from_url(config.redis_url, decode_responses=True), config, [SAE])
    acme, other = bearer(new_key(config, "acme", "acme")), bearer(new_key(config, "other", "other"))
    profile = {"sae_id": SAE["id"], "features": [{"index": 3, "strength": 4.0}], "vectors": []}
    put = client.put("/v1/steering/profile", json=profile, headers=acme).get_json()
    assert put == {"object": "steering.profile", "scope": "tenant", "tenant": "acme", "profile": profile}
    assert client.get("/v1/steering/profile", headers=acme).get_json() == put
    assert client.get("/v1/steering/profile", headers=other).get_json()["profile"] is None
    assert client.get("/v1/steering/profile?scope=worker", headers=acme).get_json()["profile"] is None
    store = redis.Redis.from_url(config.redis_url, decode_responses=True)
    assert read_profile(store, config, "acme") is not None and read_profile(store, config) is None
    assert client.delete("/v1/steering/profile", headers=acme).get_json()["profile"] is None
    assert read_profile(store, config, "acme") is None


def test_a_keys_use_is_recorded_at_most_once_a_minute(config: Config) -> None:
    client = create_app(config).test_client()
    key = bearer(new_key(config, "watched"))
    sessions = make_session_factory(make_db_engine(config.database_url))

    def last_used() -> float | None:
        with sessions() as session:
            return session.query(ApiKeyRecord).filter_by(name="watched").one().last_used_at

    assert last_used() is None
    client.get("/v1/models", headers=key)
    first = last_used()
    client.get("/v1/models", headers=key)
    assert first is not None and last_used() == first
