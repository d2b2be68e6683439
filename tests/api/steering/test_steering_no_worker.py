"""Steering input checked by the api alone, against the SAE listing a worker would publish: batch lines take
`steering` and `monitor`, the profile is validated like a request's steering, and no listing means no SAE."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from api.app import create_app
from tasks.config import Config
from tasks.steering_store import publish_saes
from tasks.store.db import upgrade_to_head
from tests.api.batches.test_batches_no_worker import chat_line, create_batch
from tests.conftest import make_test_config

SAE = {"id": "tiny/resid_post_2", "hook_name": "blocks.2.hook_resid_post", "d_in": 128, "d_sae": 512}


@pytest.fixture
def api(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[tuple[Config, FlaskClient, redis.Redis]]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = make_test_config(tiny_model_dir, redis_url, database_url, worker_lease_s=60.0)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield config, create_app(config).test_client(), client
    client.delete(config.bulk_queue_of(config.model_name))
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def test_without_a_worker_no_sae_is_listed_or_accepted(api: tuple[Config, FlaskClient, redis.Redis]) -> None:
    config, client, _ = api
    assert client.get("/v1/saes").get_json() == {"object": "list", "data": []}
    body = {"model": config.model_name, "prompt": "hi", "steering": {"sae_id": SAE["id"], "features": []}}
    error = client.post("/v1/completions", json=body).get_json()["error"]
    assert error["param"] == "steering.sae_id" and error["code"] == "sae_not_found"


def test_batch_lines_take_steering_and_monitors_validated_like_requests(
    api: tuple[Config, FlaskClient, redis.Redis],
) -> None:
    config, client, redis_client = api
    publish_saes(redis_client, config, [SAE])
    steering = {"sae_id": SAE["id"], "features": [{"index": 3, "strength": 4.0}]}
    lines = [
        chat_line("steered", config.model_name, steering=steering),
        chat_line("monitored", config.model_name, monitor={"sae_id": SAE["id"]}),
        chat_line("over-monitored", config.model_name, monitor={"sae_id": SAE["id"], "top_k": 10**6}),
        chat_line("too-far", config.model_name, steering={**steering, "features": [{"index": 512, "strength": 1}]}),
    ]
    batch = create_batch(client, lines)
    errors = {error["line"]: error for error in batch["errors"]["data"]}
    assert sorted(errors) == [3, 4]  # the steered and the monitored lines were accepted
    assert errors[3]["param"] == "monitor.top_k"
    assert errors[4]["param"] == "steering.features.0.index"


@pytest.mark.parametrize("path", ["/etc/passwd", "../vectors/x.safetensors", "x.pt"])
def test_a_vector_path_outside_the_vector_root_is_refused_with_its_param(
    api: tuple[Config, FlaskClient, redis.Redis], path: str
) -> None:
    config, client, _ = api
    steering = {"vectors": [{"layer": 0, "path": "ok.safetensors"}, {"layer": 1, "path": path}]}
    reply = client.post("/v1/completions", json={"model": config.model_name, "prompt": "hi", "steering": steering})
    error = reply.get_json()["error"]
    assert reply.status_code == 400 and error["param"] == "steering.vectors.1.path", error
    batch = create_batch(client, [chat_line("line", config.model_name, steering=steering)])
    [line_error] = batch["errors"]["data"]
    assert line_error["param"] == "steering.vectors.1.path", line_error


def test_the_profile_is_validated_and_cleared(api: tuple[Config, FlaskClient, redis.Redis]) -> None:
    config, client, redis_client = api
    publish_saes(redis_client, config, [SAE])
    bad = client.put("/v1/steering/profile", json={"sae_id": SAE["id"], "features": [{"index": 600, "strength": 1}]})
    assert bad.status_code == 400 and bad.get_json()["error"]["param"] == "features.0.index"
    profile = {"sae_id": SAE["id"], "features": [{"index": 3, "strength": 4.0}], "vectors": []}
    assert client.put("/v1/steering/profile", json=profile).get_json()["profile"] == profile
    assert client.get("/v1/steering/profile").get_json()["profile"] == profile
    assert client.delete("/v1/steering/profile").get_json()["profile"] is None
    assert client.get("/v1/monitor").get_json() == {"object": "monitor", "settings": None, "workers": []}
