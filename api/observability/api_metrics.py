"""The api process's own counters: admission refusals and backend errors.

They live in this process. With more than one gunicorn worker process (api/gunicorn_conf.py runs one), set
PROMETHEUS_MULTIPROC_DIR to a directory: prometheus_client then keeps every process's values in files there and
/metrics sums them (its multiprocess mode), whichever process answers the scrape. gunicorn's master empties it at
start (`clear_multiprocess_dir`), so an earlier run's processes do not count twice."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics
from prometheus_client.multiprocess import MultiProcessCollector

from tasks.backend_errors import backend_of
from tasks.streams.worker_stats import METRIC_PREFIX

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

disable_created_metrics()  # a process's start time as a series per label set: noise next to the workers' series
_REGISTRY = CollectorRegistry(auto_describe=False)
ADMISSION_REJECTIONS = Counter(
    f"{METRIC_PREFIX}admission_rejections",
    "Generation requests the api refused before queueing them (429 and 503), by reason (the error's code).",
    ["model_name", "reason"],
    registry=_REGISTRY,
)
API_BACKEND_ERRORS = Counter(
    f"{METRIC_PREFIX}api_backend_errors",
    "Redis and database errors that made the api answer 503.",
    ["backend"],
    registry=_REGISTRY,
)


def count_rejection(model: str, reason: str | None) -> None:
    ADMISSION_REJECTIONS.labels(model, reason or "unknown").inc()


def count_backend_error(exc: BaseException) -> None:
    backend = backend_of(exc)
    if backend is not None:
        API_BACKEND_ERRORS.labels(backend).inc()


def api_registry() -> CollectorRegistry:
    """Every api process's counters when PROMETHEUS_MULTIPROC_DIR is set, else this process's."""
    if not os.environ.get(MULTIPROC_DIR_ENV):
        return _REGISTRY
    registry = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(registry)
    return registry


def clear_multiprocess_dir() -> None:
    """Removes the files of an earlier run's processes, before any process of this run writes its own."""
    directory = os.environ.get(MULTIPROC_DIR_ENV)
    if directory:
        for path in Path(directory).glob("*.db"):
            path.unlink()
