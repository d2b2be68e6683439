"""/metrics in Prometheus' text format: the api's own counters, every live worker's published families with
`model_name` and `worker` labels (a dead worker's series go with its lease), and the served models' queues."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.observability.api_metrics import api_registry
from api.observability.cluster import ClusterState
from tasks.streams.worker_stats import METRIC_PREFIX, WorkerStats


class ClusterCollector(Collector):
    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        yield from worker_families(self._state.workers)
        yield from self._model_gauges()
        yield self._heartbeats()

    def _model_gauges(self) -> Iterator[Metric]:
        live = GaugeMetricFamily(f"{METRIC_PREFIX}num_live_workers", "Workers holding a lease.", labels=["model_name"])
        depth = GaugeMetricFamily(
            f"{METRIC_PREFIX}queue_depth", "Celery messages waiting, by queue kind.", labels=["model_name", "queue"]
        )
        waiting = GaugeMetricFamily(
            f"{METRIC_PREFIX}num_requests_waiting",
            "Requests taken and not yet running: the Celery queue (batch lines: not yet claimed) plus the engines' "
            "waiting rows, by queue kind.",
            labels=["model_name", "queue"],
        )
        lines = GaugeMetricFamily(
            f"{METRIC_PREFIX}batch_lines", "Open batch lines by status.", labels=["model_name", "status"]
        )
        for model in self._state.models:
            live.add_metric([model.name], len(model.workers))
            for kind, count in model.queue_depth.items():
                depth.add_metric([model.name, kind], count)
            for kind, count in model.num_waiting.items():
                waiting.add_metric([model.name, kind], count)
            for status, count in model.open_lines.items():
                lines.add_metric([model.name, status], count)
        yield from (live, depth, waiting, lines)

    def _heartbeats(self) -> Metric:
        ages = GaugeMetricFamily(
            f"{METRIC_PREFIX}worker_heartbeat_age_seconds",
            "Since the worker last renewed its lease and published its stats.",
            labels=["model_name", "worker"],
        )
        for worker in self._state.workers:
            ages.add_metric([worker.model, worker.worker], worker.heartbeat_age_s(self._state.read_at))
        return ages


def worker_families(workers: list[WorkerStats]) -> Iterator[Metric]:
    """One family per name over all workers, each sample labelled with its worker and model."""
    families: dict[str, Metric] = {}
    for worker in workers:
        extra = {"model_name": worker.model, "worker": worker.worker}
        for family in worker.families:
            metric = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            for name, labels, value in family.samples:
                metric.add_sample(name, {**labels, **extra}, value)
    yield from families.values()


def render_metrics(state: ClusterState) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(api_registry())
    registry.register(ClusterCollector(state))
    return generate_latest(registry)
