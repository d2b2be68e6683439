"""The worker's Batch API side: the chunk runner its Celery threads use, and the reaper and stop-watcher threads every
worker runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
from celery import Celery
from transformers import PreTrainedTokenizerFast

from tasks.batches.events import publish_status
from tasks.batches.finalize import finalize_if_done
from tasks.batches.messages import ChunkTask
from tasks.celery_app import enqueue_chunk
from tasks.config import Config
from tasks.reapers.batch_reaper import dispatch_and_enqueue, reap_once
from tasks.store.db import SessionFactory
from worker.engine.interface import Engine
from worker.serving.batch_chunk import ChunkRunner
from worker.serving.batch_stops import StopWatcher
from worker.serving.metrics import ServingMetrics
from worker.serving.periodic import PeriodicThread

logger = logging.getLogger(__name__)


@dataclass
class BulkRuntime:
    chunks: ChunkRunner
    reaper: PeriodicThread
    stops: StopWatcher

    def stop(self) -> None:
        self.reaper.stop()
        self.stops.stop()


def start_bulk(
    config: Config,
    celery: Celery,
    engine: Engine,
    tokenizer: PreTrainedTokenizerFast,
    client: redis.Redis,
    sessions: SessionFactory,
    worker: str,
    metrics: ServingMetrics,
) -> BulkRuntime:
    def enqueue(chunk: ChunkTask) -> None:
        enqueue_chunk(celery, config, chunk)

    def after_chunk(batch_id: str) -> None:
        with sessions() as session:
            if finalize_if_done(session, batch_id):
                publish_status(client, config, session, batch_id)
            dispatch_and_enqueue(session, config, enqueue)

    if config.batch_chunks_in_flight >= config.worker_threads:
        logger.warning(
            "BATCH_CHUNKS_IN_FLIGHT (%d) >= WORKER_CONCURRENCY (%d): chunks can take every thread chat needs",
            config.batch_chunks_in_flight,
            config.worker_threads,
        )
    stops = StopWatcher(client, config)
    stops.start()
    chunks = ChunkRunner(config, engine, tokenizer, client, sessions, worker, metrics, stops, after_chunk)

    def reap() -> None:
        reap_once(sessions, client, config, enqueue)

    reaper = PeriodicThread("batch-reaper", config.batch_reaper_interval_s, reap)
    reaper.start()
    return BulkRuntime(chunks, reaper, stops)
