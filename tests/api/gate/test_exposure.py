"""The api's real entry point (gunicorn with api/gunicorn_conf.py) in a subprocess: with no key anywhere it refuses
to bind beyond loopback, exiting non-zero with the reason; with a key, or on loopback, it serves."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tasks.config import REPO_ROOT, Config
from tasks.store.api_keys import create_key
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tests.conftest import make_test_config

START_TIMEOUT_S = 90.0


@pytest.fixture
def config(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Config:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    return make_test_config(tiny_model_dir, redis_url, database_url)


def start_api(config: Config) -> subprocess.Popen:
    command = [sys.executable, "-m", "gunicorn", "-c", "python:api.gunicorn_conf", "api.app:create_app()"]
    env = {**os.environ, **config.to_env()}
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def serves(api: subprocess.Popen, config: Config) -> bool:
    """True once /health answers on loopback; False if the process exits first."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and api.poll() is None:
        try:
            return requests.get(f"http://127.0.0.1:{config.port}/health", timeout=2).status_code == 200
        except requests.RequestException:  # bound, but the worker is still loading the app
            time.sleep(0.3)
    return False


def stop(api: subprocess.Popen) -> str:
    api.terminate()
    output, _ = api.communicate(timeout=30)
    return output


def test_no_key_and_a_public_address_refuses_to_start(config: Config) -> None:
    api = start_api(dataclasses.replace(config, host="0.0.0.0"))
    output, _ = api.communicate(timeout=START_TIMEOUT_S)
    assert api.returncode != 0
    assert "refusing to serve on 0.0.0.0 with no API key" in output
    assert "scripts.cli.api_keys create" in output  # and says what to do


@pytest.mark.parametrize("key_source", ["API_KEY", "a key in SQL"])
def test_a_key_lets_it_serve_on_a_public_address(config: Config, key_source: str) -> None:
    if key_source == "API_KEY":
        config = dataclasses.replace(config, api_key="sb-deployment-key")
    else:
        with make_session_factory(make_db_engine(config.database_url))() as session:
            create_key(session, "ops")
    api = start_api(dataclasses.replace(config, host="0.0.0.0"))
    try:
        assert serves(api, config)
        assert requests.get(f"http://127.0.0.1:{config.port}/v1/models", timeout=5).status_code == 401
    finally:
        output = stop(api)
    assert "sb-deployment-key" not in output


def test_no_key_on_loopback_serves_open_and_warns(config: Config) -> None:
    api = start_api(config)
    try:
        assert serves(api, config)
        assert requests.get(f"http://127.0.0.1:{config.port}/v1/models", timeout=5).status_code == 200
    finally:
        output = stop(api)
    assert "no API key exists: the api is open to clients on this machine" in output
