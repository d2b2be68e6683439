"""The worker's Prometheus metrics, in vLLM's meanings under a `steerbatch:` prefix.

Its Celery threads and output processor observe what a client sees (first token, gaps between tokens, the whole
request, tokens, finish reasons, steered and monitored rows, batch lines, Redis and database errors) in a
prometheus_client registry of its own; what the engine counts is read from the engine when the lease thread collects
them. The lease thread publishes the collected families with the lease (tasks/streams/worker_stats.py); the api renders
every
live worker's with `model_name` and `worker` labels (api/observability/). Nothing here runs on the engine thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tasks.backend_errors import backend_of
from tasks.batches.models import LineStatus
from tasks.messages.generation import FinishReason, GenerateRequest
from tasks.streams.worker_stats import BULK, INTERACTIVE, METRIC_PREFIX, MetricFamily, WorkerStats
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import BULK_PRIORITY, INTERACTIVE_PRIORITY
from worker.engine.model_facts import ModelFacts

if TYPE_CHECKING:
    from worker.engine_process.client import EngineProcess

# vLLM's buckets (vllm/v1/metrics/loggers.py), so dashboards and quantiles read the same
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)  # fmt: skip
ERROR_FINISH_REASON = "error"  # request_success's finished_reason for a request that ended in an error


class ServingMetrics:
    """Thread-safe (prometheus_client's metrics lock their own values); one per worker."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.time_to_first_token = self._histogram(
            "time_to_first_token_seconds", "From the api taking a request to its first token in Redis.", TTFT_BUCKETS
        )
        self.inter_token_latency = self._histogram(
            "inter_token_latency_seconds", "Between a request's consecutive token writes to Redis.", ITL_BUCKETS
        )
        self.e2e_request_latency = self._histogram(
            "e2e_request_latency_seconds", "From the api taking a request to its recorded result.", E2E_BUCKETS
        )
        self.prompt_tokens = self._counter("prompt_tokens", "Prompt tokens of finished requests and batch lines.")
        self.generation_tokens = self._counter(
            "generation_tokens", "Tokens generated for finished requests and batch lines (usage.completion_tokens)."
        )
        self.request_success = self._counter(
            "request_success", "Finished requests and batch lines, by finish reason.", "finished_reason"
        )
        self.steered_rows = self._counter("steered_rows", "Engine rows (choices) run with SAE steering.")
        self.monitored_rows = self._counter("monitored_rows", "Engine rows run with an SAE monitor.")
        self.batch_lines_finished = self._counter("batch_lines_finished", "Batch lines recorded, by status.", "status")
        self.backend_errors = self._counter("backend_errors", "Redis and database errors the worker met.", "backend")

    def _histogram(self, name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(f"{METRIC_PREFIX}{name}", documentation, buckets=buckets, registry=self.registry)

    def _counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(f"{METRIC_PREFIX}{name}", documentation, labels, registry=self.registry)

    def observe_tokens(self, request: GenerateRequest, last_token_at: float | None, now: float) -> None:
        """A pass of the output processor wrote new tokens of `request` at `now` (unix seconds)."""
        if last_token_at is None:
            self.time_to_first_token.observe(max(0.0, now - request.arrival_time))
        else:
            self.inter_token_latency.observe(now - last_token_at)

    def observe_finished(
        self,
        request: GenerateRequest,
        finish_reason: FinishReason | None,
        num_generated: int,
        *,
        is_error: bool,
        is_steered: bool,
    ) -> None:
        """A request or batch line has its one result."""
        reason = ERROR_FINISH_REASON if is_error or finish_reason is None else finish_reason.value
        self.request_success.labels(reason).inc()
        self.prompt_tokens.inc(len(request.prompt_token_ids))
        self.generation_tokens.inc(num_generated)
        if is_steered:
            self.steered_rows.inc(request.n)
        if request.monitor is not None:
            self.monitored_rows.inc()  # only choice 0 is monitored

    def observe_e2e(self, request: GenerateRequest) -> None:
        """A request (not a batch line, whose wait is its batch's) has its result now."""
        self.e2e_request_latency.observe(max(0.0, time.time() - request.arrival_time))

    def count_line(self, status: LineStatus) -> None:
        self.batch_lines_finished.labels(status.value).inc()

    def count_error(self, exc: BaseException) -> None:
        backend = backend_of(exc)
        if backend is not None:
            self.backend_errors.labels(backend).inc()


class EngineCollector(Collector):
    """What the engine counts, read when collected: counters from its stats, gauges from its current load."""

    def __init__(self, engine: ContinuousEngine | EngineProcess) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        stats, load, block_size = self._engine.stats, self._engine.load(), self._engine.block_size
        yield _gauge("num_requests_running", "Requests in the engine's batch.", load.num_running)
        waiting = GaugeMetricFamily(
            f"{METRIC_PREFIX}engine_num_requests_waiting",
            "Requests in the engine waiting for room, by queue.",
            labels=["queue"],
        )
        for queue, priority in ((INTERACTIVE, INTERACTIVE_PRIORITY), (BULK, BULK_PRIORITY)):
            waiting.add_metric([queue], load.num_waiting_by_priority.get(priority, 0))
        yield waiting
        yield _gauge("kv_cache_usage_perc", "KV-cache usage: 1 means every block is held.", load.kv_cache_usage)
        queried_tokens = stats.prefix_cache_queried_blocks * block_size
        yield _counter("prefix_cache_queries", "Prefix cache queries, in queried tokens.", queried_tokens)
        hit_tokens = stats.prefix_cache_hit_blocks * block_size
        yield _counter("prefix_cache_hits", "Prefix cache hits, in cached tokens.", hit_tokens)
        yield _counter("spec_decode_num_drafts", "Speculative verifications.", stats.num_verifications)
        yield _counter("spec_decode_num_draft_tokens", "Proposed (draft) tokens.", stats.num_proposed_tokens)
        yield _counter("spec_decode_num_accepted_tokens", "Accepted draft tokens.", stats.num_accepted_tokens)
        yield _counter("num_preemptions", "Requests preempted for KV blocks.", stats.num_preemptions)
        yield _counter("engine_steps", "Forward passes.", stats.num_steps)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{METRIC_PREFIX}{name}", documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{METRIC_PREFIX}{name}", documentation, value=value)


def collect_families(registry: CollectorRegistry) -> list[MetricFamily]:
    """The registry's families as JSON-ready values, without the `_created` series (a worker's start time)."""
    families = []
    for metric in registry.collect():
        samples = [(s.name, dict(s.labels), s.value) for s in metric.samples if not s.name.endswith("_created")]
        families.append(MetricFamily(metric.name, metric.type, metric.documentation, samples))
    return families


def worker_stats(
    worker: str, model: str, facts: ModelFacts, engine: ContinuousEngine | EngineProcess, registry: CollectorRegistry
) -> WorkerStats:
    """What the lease thread publishes: `registry` holds the serving metrics and an EngineCollector of `engine`;
    `facts` say how the model's weights and KV pool are stored."""
    load = engine.load()
    return WorkerStats(
        worker=worker,
        model=model,
        published_at=time.time(),
        num_running=load.num_running,
        num_waiting={
            INTERACTIVE: load.num_waiting_by_priority.get(INTERACTIVE_PRIORITY, 0),
            BULK: load.num_waiting_by_priority.get(BULK_PRIORITY, 0),
        },
        kv_cache_usage=load.kv_cache_usage,
        engine=engine.stats.to_dict(),
        families=collect_families(registry),
        quantization=facts.quantization,
        kv_cache_dtype=facts.kv_cache_dtype,
        kv_cache_tokens=facts.kv_cache_tokens,
    )
