"""Each worker's load and metrics, published to Redis beside its lease and with its TTL, so the api's /metrics and
/health/ready show every live worker and a dead worker's numbers disappear with its lease."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis

from tasks.config import Config
from tasks.streams.worker_leases import live_worker_leases

METRIC_PREFIX = "steerbatch:"  # vLLM's metric names with ours instead of "vllm:", so its dashboards translate
INTERACTIVE = "interactive"  # the kinds of queue a model has: chat and completions, and batch lines
BULK = "bulk"
QUEUE_KINDS = (INTERACTIVE, BULK)

Sample = tuple[str, dict[str, str], float]  # (sample name, labels, value), as prometheus_client collects them


@dataclass(frozen=True)
class MetricFamily:
    """One Prometheus metric family: `type` is prometheus_client's (counter, gauge, histogram)."""

    name: str
    type: str
    documentation: str
    samples: list[Sample]

    def to_dict(self) -> dict[str, Any]:
        samples = [[name, labels, value] for name, labels, value in self.samples]
        return {"name": self.name, "type": self.type, "documentation": self.documentation, "samples": samples}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricFamily:
        samples = [(str(name), dict(labels), float(value)) for name, labels, value in data["samples"]]
        return cls(data["name"], data["type"], data["documentation"], samples)


@dataclass(frozen=True)
class WorkerStats:
    """What a worker last published: its model and how it is quantized, when (its heartbeat), its engine's load and
    all of its metrics."""

    worker: str
    model: str
    published_at: float  # unix seconds
    num_running: int  # requests in the engine's batch
    num_waiting: dict[str, int]  # requests in the engine waiting for room, by queue kind
    kv_cache_usage: float  # the fraction of KV blocks held by requests, 0 to 1
    engine: dict[str, Any]  # worker.engine.stats.EngineStats.to_dict()
    families: list[MetricFamily]
    quantization: str = (
        "none"  # the model's weights: "none", or "<method>:<scheme>" (worker/engine/loading/quantization.py)
    )
    kv_cache_dtype: str = ""  # what the KV pool holds: "int8" or "fp8_e4m3" codes, or the model's dtype
    kv_cache_tokens: int = 0  # the token slots the KV pool holds for requests

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "model": self.model,
            "published_at": self.published_at,
            "num_running": self.num_running,
            "num_waiting": dict(self.num_waiting),
            "kv_cache_usage": self.kv_cache_usage,
            "engine": self.engine,
            "families": [family.to_dict() for family in self.families],
            "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype,
            "kv_cache_tokens": self.kv_cache_tokens,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerStats:
        return cls(
            worker=data["worker"],
            model=data["model"],
            published_at=float(data["published_at"]),
            num_running=int(data["num_running"]),
            num_waiting={str(kind): int(n) for kind, n in data["num_waiting"].items()},
            kv_cache_usage=float(data["kv_cache_usage"]),
            engine=dict(data["engine"]),
            families=[MetricFamily.from_dict(family) for family in data["families"]],
            quantization=str(data["quantization"]),
            kv_cache_dtype=str(data["kv_cache_dtype"]),
            kv_cache_tokens=int(data["kv_cache_tokens"]),
        )

    def heartbeat_age_s(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.published_at)


def worker_stats_key(config: Config, worker: str) -> str:
    return f"{config.redis_prefix}stats:worker:{worker}"


def publish_worker_stats(client: redis.Redis, config: Config, stats: WorkerStats) -> None:
    """Expires with the lease, so a dead worker's numbers do not linger as if it were alive."""
    key = worker_stats_key(config, stats.worker)
    client.set(key, json.dumps(stats.to_dict()), px=int(config.worker_lease_s * 1000))


def read_live_worker_stats(client: redis.Redis, config: Config) -> list[WorkerStats]:
    """Every worker whose lease runs, by name, in two round trips; one that has not published yet is left out."""
    workers = sorted(name for name, _ in live_worker_leases(client, config))
    if not workers:
        return []
    raws = client.mget([worker_stats_key(config, worker) for worker in workers])
    return [WorkerStats.from_dict(json.loads(raw)) for raw in raws if raw is not None]
