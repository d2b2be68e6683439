"""What /metrics and /health/ready report about the models this api serves, read in one go from Redis (live workers'
published stats, Celery queue depths) and SQL (open batch lines)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis
from kombu.transport.redis import PRIORITY_STEPS
from kombu.transport.redis import Channel as RedisChannel
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tasks.batches.models import BatchLine, BatchRecord, LineStatus
from tasks.config import Config
from tasks.streams.worker_stats import BULK, INTERACTIVE, QUEUE_KINDS, WorkerStats, read_live_worker_stats

NOT_YET_CLAIMED = (LineStatus.QUEUED.value, LineStatus.DISPATCHED.value)  # open lines no worker's engine holds
OPEN_STATUSES = (*NOT_YET_CLAIMED, LineStatus.RUNNING.value)


def served_queues(config: Config) -> dict[str, dict[str, str]]:
    """Each served model's Celery queue by kind: the one place that knows which queues a model's work waits in."""
    return {
        model: {INTERACTIVE: config.interactive_queue_of(model), BULK: config.bulk_queue_of(model)}
        for model in config.served_model_paths()
    }


@dataclass(frozen=True)
class ModelState:
    name: str
    workers: list[WorkerStats]  # live ones, by name
    queue_depth: dict[str, int]  # Celery messages waiting, by queue kind
    open_lines: dict[str, int] = field(default_factory=dict)  # batch lines by open status

    @property
    def num_running(self) -> int:
        return sum(worker.num_running for worker in self.workers)

    @property
    def num_waiting(self) -> dict[str, int]:
        """vLLM's num_requests_waiting per queue: taken by the api, not yet in an engine's batch. Interactive: queued
        Celery messages (one request each) and engines' waiting rows; bulk: lines no worker has claimed and engines'
        waiting lines (a chunk's lines all enter the engine when it is claimed)."""
        in_engines = {kind: sum(worker.num_waiting.get(kind, 0) for worker in self.workers) for kind in QUEUE_KINDS}
        not_claimed = sum(self.open_lines.get(status, 0) for status in NOT_YET_CLAIMED)
        return {
            INTERACTIVE: self.queue_depth[INTERACTIVE] + in_engines[INTERACTIVE],
            BULK: not_claimed + in_engines[BULK],
        }

    @property
    def kv_cache_usage(self) -> float:
        """The fullest worker's: the one a new request would wait on."""
        return max((worker.kv_cache_usage for worker in self.workers), default=0.0)


@dataclass(frozen=True)
class ClusterState:
    models: list[ModelState]  # the served ones, in order
    workers: list[WorkerStats]  # every live worker on this Redis prefix, of any model
    read_at: float  # unix seconds


def read_cluster(client: redis.Redis, config: Config, session: Session) -> ClusterState:
    workers = read_live_worker_stats(client, config)
    queues = served_queues(config)
    depths = queue_depths(client, [queue for by_kind in queues.values() for queue in by_kind.values()])
    lines = open_batch_lines(session)
    models = [
        ModelState(
            name,
            [worker for worker in workers if worker.model == name],
            {kind: depths[queue] for kind, queue in by_kind.items()},
            lines.get(name, {}),
        )
        for name, by_kind in queues.items()
    ]
    return ClusterState(models, workers, time.time())


def queue_depths(client: redis.Redis, queues: list[str]) -> dict[str, int]:
    """Messages waiting in each Celery queue: kombu keeps one Redis list per queue and priority step."""
    keys = {queue: [queue, *(f"{queue}{RedisChannel.sep}{step}" for step in PRIORITY_STEPS[1:])] for queue in queues}
    with client.pipeline(transaction=False) as pipe:
        for queue_keys in keys.values():
            for key in queue_keys:
                pipe.llen(key)
        lengths = iter(pipe.execute())
    return {queue: sum(next(lengths) for _ in queue_keys) for queue, queue_keys in keys.items()}


def open_batch_lines(session: Session) -> dict[str, dict[str, int]]:
    """Open batch lines by model and status (the status index bounds the scan to open lines)."""
    query = (
        select(BatchRecord.model, BatchLine.status, func.count())
        .join(BatchRecord, BatchLine.batch_id == BatchRecord.id)
        .where(BatchLine.status.in_(OPEN_STATUSES))
        .group_by(BatchRecord.model, BatchLine.status)
    )
    counts: dict[str, dict[str, int]] = {}
    for model, status, count in session.execute(query):
        counts.setdefault(model, {})[status] = int(count)
    session.commit()  # ends the read's transaction
    return counts
