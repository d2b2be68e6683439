"""`make serve`'s supervisor: a SIGKILLed worker is started again and the stack keeps serving; the streamed request
the dead worker held ends with one `worker_lost` error event, and its record says so."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from tasks.config import REPO_ROOT
from tests.conftest import free_port, make_test_config

logger = logging.getLogger(__name__)


def wait_for(pattern: str, log_path: Path, timeout_s: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if match := re.search(pattern, log_path.read_text(errors="replace")):
            return match
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} never appeared in the serve log:\n{log_path.read_text()[-3000:]}")


def test_a_killed_worker_is_restarted_and_its_request_fails_unwatched(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    config = make_test_config(tiny_model_dir, redis_url, f"sqlite:///{tmp_path / 'db.sqlite'}", worker_lease_s=2.0)
    env = {**os.environ, **config.to_env(), "FLOWER_PORT": str(free_port()), "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / "serve.log"
    command = [sys.executable, "-m", "scripts.serve"]
    with log_path.open("wb") as log:
        serve = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(r"stack ready", log_path, 180)
        worker_pid = int(wait_for(r"started worker \(pid (\d+)\)", log_path, 1).group(1))
        base_url = f"http://{config.host}:{config.port}"
        body = {"model": config.model_name, "prompt": "the cat", "max_tokens": 3000, "ignore_eos": True}
        with requests.post(f"{base_url}/v1/completions", json={**body, "stream": True}, stream=True, timeout=60) as r:
            lines = r.iter_lines(decode_unicode=True)
            data = (line.removeprefix("data: ") for line in lines if line.startswith("data"))
            request_id = json.loads(next(data))["id"]
            os.kill(worker_pid, signal.SIGKILL)
            killed_at = time.monotonic()
            rest = list(data)
            error_after_s = time.monotonic() - killed_at
        assert rest[-1] == "[DONE]" and json.loads(rest[-2])["error"]["code"] == "worker_lost", rest[-2:]
        record = requests.get(f"{base_url}/v1/requests/{request_id}", timeout=5).json()
        assert record["status"] == "failed" and record["error"]["code"] == "worker_lost", record

        wait_for(r"worker started again", log_path, 30)
        deadline = time.monotonic() + 120
        while True:  # as a client does: 503 no_worker_available until the new worker has loaded its model
            reply = requests.post(f"{base_url}/v1/completions", json={**body, "max_tokens": 4}, timeout=60)
            if reply.status_code != 503 or time.monotonic() > deadline:
                break
            assert reply.json()["error"]["code"] == "no_worker_available"
            time.sleep(float(reply.headers["Retry-After"]) / 5)
        assert reply.status_code == 200, reply.text
        assert serve.poll() is None, "the stack stopped"
        served_after_s = time.monotonic() - killed_at
        logger.info("worker SIGKILL: error event in %.1f s, served again in %.1f s", error_after_s, served_after_s)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
