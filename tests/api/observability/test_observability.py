"""/health/ready and /metrics on a real Redis and SQL, with a worker's lease and stats published the worker's way
(tasks/streams/worker_leases.py, tasks/streams/worker_stats.py) instead of a whole worker: readiness and a worker's
series follow the lease. The running stack's side is tests/service/observability/test_metrics.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from tasks.config import REPO_ROOT, Config
from tasks.store.db import upgrade_to_head
from tasks.streams.worker_leases import renew_worker_lease
from tasks.streams.worker_stats import BULK, INTERACTIVE, WorkerStats, publish_worker_stats
from tests.conftest import free_port, make_test_config
from worker.serving.metrics import ServingMetrics, collect_families

LEASE_S = 0.5
QUANTIZATION = "torchao:Int8WeightOnlyConfig"  # as a worker publishes it


@pytest.fixture
def api(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[tuple[Config, FlaskClient]]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = make_test_config(tiny_model_dir, redis_url, database_url, worker_lease_s=LEASE_S)
    yield config, create_app(config).test_client()  # no key exists: loopback clients are admin (open mode)
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def publish_worker(config: Config, name: str, num_ttft: int) -> None:
    metrics = ServingMetrics()
    for _ in range(num_ttft):
        metrics.time_to_first_token.observe(0.05)
    stats = WorkerStats(name, config.model_name, time.time(), 2, {INTERACTIVE: 1, BULK: 3}, 0.25, {},
                        collect_families(metrics.registry), QUANTIZATION, "int8", 16384)  # fmt: skip
    client = redis.Redis.from_url(config.redis_url)
    renew_worker_lease(client, config, name)
    publish_worker_stats(client, config, stats)


def scrape(client: FlaskClient) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.content_type.startswith("text/plain")
    return {family.name: family for family in text_string_to_metric_families(response.get_data(as_text=True))}


def test_ready_is_503_without_a_worker_and_lists_a_live_one(api: tuple[Config, FlaskClient]) -> None:
    config, client = api
    assert client.get("/health").status_code == 200
    response = client.get("/health/ready")
    assert response.status_code == 503
    body = response.get_json()
    assert body["error"]["code"] == "no_worker_available" and body["error"]["type"] == "service_unavailable"
    assert body["models"][config.model_name]["workers"] == []

    publish_worker(config, "w1", num_ttft=0)
    response = client.get("/health/ready")
    assert response.status_code == 200, response.get_json()
    model = response.get_json()["models"][config.model_name]
    [worker] = model["workers"]
    assert worker["name"] == "w1" and 0 <= worker["heartbeat_age_s"] < LEASE_S
    assert worker["quantization"] == QUANTIZATION
    assert (worker["kv_cache_dtype"], worker["kv_cache_tokens"]) == ("int8", 16384)
    [listed] = client.get("/v1/models").get_json()["data"]
    assert (listed["id"], listed["quantization"]) == (config.model_name, QUANTIZATION)
    assert model["num_requests_running"] == 2 and model["kv_cache_usage"] == 0.25
    assert model["queue_depth"] == {INTERACTIVE: 0, BULK: 0}
    assert model["num_requests_waiting"] == {INTERACTIVE: 1, BULK: 3}  # the engine's, nothing in Celery or SQL


def test_a_workers_series_go_with_its_lease(api: tuple[Config, FlaskClient]) -> None:
    config, client = api
    publish_worker(config, "w1", num_ttft=3)
    publish_worker(config, "w2", num_ttft=1)
    counts = {s.labels["worker"]: s.value for s in scrape(client)["steerbatch:time_to_first_token_seconds"].samples
              if s.name.endswith("_count")}  # fmt: skip
    assert counts == {"w1": 3, "w2": 1}
    live = scrape(client)["steerbatch:num_live_workers"].samples
    assert [(s.labels["model_name"], s.value) for s in live] == [(config.model_name, 2)]

    time.sleep(LEASE_S * 1.5)
    families = scrape(client)
    assert families["steerbatch:num_live_workers"].samples[0].value == 0
    assert "steerbatch:time_to_first_token_seconds" not in families
    assert client.get("/health/ready").status_code == 503


def test_refusals_are_counted_by_reason(api: tuple[Config, FlaskClient]) -> None:
    config, client = api

    def refusals() -> float:
        samples = scrape(client)["steerbatch:admission_rejections"].samples
        return sum(s.value for s in samples if s.labels == {"model_name": config.model_name,
                                                             "reason": "no_worker_available"})  # fmt: skip

    before = refusals() if "steerbatch:admission_rejections" in scrape(client) else 0.0
    body = {"model": config.model_name, "prompt": "hi", "max_tokens": 2}
    for _ in range(2):
        assert client.post("/v1/completions", json=body).status_code == 503
    assert refusals() == before + 2


def test_api_counters_add_up_over_processes_in_multiprocess_mode(tmp_path: Path) -> None:
    """gunicorn with several api processes: each counts in its own files, any of them renders the sum, and the next
    start begins from nothing."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    count = "from api.observability.api_metrics import count_rejection; count_rejection('tiny', 'queue_full')"
    for _ in range(2):
        subprocess.run([sys.executable, "-c", count], cwd=REPO_ROOT, env=env, check=True, timeout=60)
    render = "from prometheus_client import generate_latest; from api.observability.api_metrics import api_registry; "
    render += "print(generate_latest(api_registry()).decode())"
    done = subprocess.run([sys.executable, "-c", render], cwd=REPO_ROOT, env=env, check=True, timeout=60,
                          capture_output=True, text=True)  # fmt: skip
    [family] = [f for f in text_string_to_metric_families(done.stdout) if f.name == "steerbatch:admission_rejections"]
    assert [(s.labels["reason"], s.value) for s in family.samples] == [("queue_full", 2.0)]

    clear = "from api.observability.api_metrics import clear_multiprocess_dir; clear_multiprocess_dir()"
    subprocess.run([sys.executable, "-c", clear], cwd=REPO_ROOT, env=env, check=True, timeout=60)  # the next start
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("down", ["redis", "database"])
def test_probes_are_503_in_openais_shape_when_a_backend_is_down(
    down: str, tiny_model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    if down == "redis":
        redis_url = f"redis://127.0.0.1:{free_port()}/0"
    else:
        database_url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"
    client = create_app(make_test_config(tiny_model_dir, redis_url, database_url)).test_client()
    for path in ("/health", "/health/ready", "/metrics"):
        response = client.get(path)
        assert response.status_code == 503, (path, response.get_data(as_text=True))
        assert response.get_json()["error"]["type"] == "service_unavailable"
