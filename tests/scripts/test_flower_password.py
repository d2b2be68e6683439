"""Flower never runs with a default password: `make serve` generates one on the first run, keeps it in a 0600 file
and shows it once; FLOWER_BASIC_AUTH wins when set; the launcher refuses Flower without one; every page of the Flower
it runs needs the password, /metrics and /healthcheck included."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from scripts.flower_password import flower_basic_auth
from scripts.stack import Stack
from tasks.config import REPO_ROOT, Config
from tests.conftest import free_port


def test_a_password_is_generated_once_kept_private_and_shown_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "var" / "flower_password"
    first = flower_basic_auth(Config(), path)
    user, password = first.split(":", 1)
    assert user == "admin" and len(password) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert password in capsys.readouterr().out
    assert flower_basic_auth(Config(), path) == first
    assert capsys.readouterr().out == ""  # shown the first time only
    assert flower_basic_auth(Config(), tmp_path / "other") != first  # random, not a default


def test_flower_basic_auth_wins_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "flower_password"
    assert flower_basic_auth(Config(flower_basic_auth="ops:s3cret"), path) == "ops:s3cret"
    assert not path.exists()


def test_the_launcher_never_starts_flower_without_a_password(tmp_path: Path) -> None:
    config = Config(is_redis_embedded=False, database_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    stack = Stack(config)
    with pytest.raises(ValueError, match="FLOWER_BASIC_AUTH"):
        stack.start(with_flower=True, ready_timeout_s=1)
    assert stack.processes == [] and not (tmp_path / "db.sqlite").exists()  # refused before anything started


@pytest.mark.parametrize("path", ["/metrics", "/healthcheck", "/workers"])
def test_every_flower_page_needs_the_password(redis_url: str, path: str) -> None:
    port = free_port()
    command = [sys.executable, "-m", "scripts.flower", "--broker", redis_url, "flower", f"--port={port}"]
    env = {**os.environ, "FLOWER_BASIC_AUTH": "ops:s3cret"}
    flower = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}{path}"
        deadline = time.monotonic() + 60
        while True:
            try:
                anonymous = requests.get(url, timeout=5)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and flower.poll() is None, "Flower did not start"
                time.sleep(0.2)
        assert anonymous.status_code == 401
        assert requests.get(url, auth=("ops", "wrong"), timeout=5).status_code == 401
        assert requests.get(url, auth=("ops", "s3cret"), timeout=5).status_code == 200
    finally:
        flower.terminate()
        flower.wait(10)
