"""Celery worker entry: `celery -A worker.app worker --pool threads`. Loads the model once, at worker start, and
consumes that model's queues (`interactive.<model>` first, then `bulk.<model>`), which all the model's workers share."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery.signals import worker_init, worker_shutdown
from celery.worker import WorkController
from kombu import Exchange, Queue
from transformers import PreTrainedTokenizerFast

from tasks.batches.messages import ChunkTask
from tasks.celery_app import BATCH_CHUNK_TASK, EMBED_TASK, GENERATE_TASK, create_celery
from tasks.config import Config
from tasks.logs import configure_logging
from tasks.messages.embeddings import EmbedRequest
from tasks.messages.generation import GenerateRequest
from tasks.reapers.request_reaper import RequestReaper, reaper_interval_s
from tasks.store.db import make_db_engine, make_session_factory
from tasks.streams.redis_keys import connect_redis
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.model_facts import ModelFacts
from worker.engine.model_runner import ModelRunner
from worker.engine_process.client import EngineProcess
from worker.serving.bulk import BulkRuntime, start_bulk
from worker.serving.embeddings.handler import EmbeddingHandler
from worker.serving.generation import GenerationHandler
from worker.serving.lease import WorkerLease, incarnation_name
from worker.serving.metrics import EngineCollector, ServingMetrics, worker_stats
from worker.serving.periodic import PeriodicThread
from worker.serving.steering_sync import SteeringSync

logger = logging.getLogger(__name__)
config = Config.from_env()
celery = create_celery(config)
# As `--queues` would declare them (a direct exchange per queue), so the api's send_task(queue=...) reaches them.
celery.conf.task_queues = [Queue(name, Exchange(name), routing_key=name) for name in config.worker_queues]


@dataclass
class WorkerRuntime:
    engine: ContinuousEngine | EngineProcess
    handler: GenerationHandler
    lease: WorkerLease
    steering: SteeringSync | None  # None: it runs in the engine's process
    reaper: PeriodicThread


_runtime: list[WorkerRuntime] = []  # filled once by worker_init, before the pool takes tasks
_bulk: list[BulkRuntime] = []  # the same, for batch chunks, the batch reaper and the stop watcher
_embeddings: list[EmbeddingHandler] = []  # the same, for embeddings requests


@worker_init.connect
def load_model(sender: WorkController, **_: object) -> None:
    configure_logging(config)
    worker = incarnation_name(sender.hostname)
    engine, facts, steering = start_engine(worker)
    client = connect_redis(config)
    metrics = ServingMetrics()
    metrics.registry.register(EngineCollector(engine))
    handler = GenerationHandler(
        config=config,
        engine=engine,
        tokenizer=PreTrainedTokenizerFast.from_pretrained(config.model),
        client=client,
        sessions=make_session_factory(make_db_engine(config.database_url)),
        worker=worker,
        metrics=metrics,
    )
    lease = WorkerLease(
        client,
        config,
        worker,
        is_healthy=engine.is_alive,
        read_stats=lambda: worker_stats(worker, config.model_name, facts, engine, metrics.registry),
        on_error=metrics.count_error,
    )
    lease.start()
    request_reaper = RequestReaper(handler.sessions, client, config)
    reaper = PeriodicThread("request-reaper", reaper_interval_s(config), request_reaper.reap_once)
    reaper.start()
    _runtime.append(WorkerRuntime(engine, handler, lease, steering, reaper))
    bulk = start_bulk(config, celery, engine, handler.tokenizer, client, handler.sessions, worker, metrics)
    _bulk.append(bulk)
    _embeddings.append(EmbeddingHandler(config, engine, handler.tokenizer, client, handler.sessions, worker, metrics))
    logger.info("worker %s ready: %s, up to %d requests per batch", worker, config.model_name, config.max_num_seqs)


def start_engine(worker: str) -> tuple[ContinuousEngine | EngineProcess, ModelFacts, SteeringSync | None]:
    """The engine, in a process of its own (which runs the steering sync beside it) or in this one."""
    if config.engine_process:
        engine = EngineProcess(config, worker)
        return engine, engine.facts, None
    runner = ModelRunner(config)
    in_process = ContinuousEngine(runner, config)
    in_process.start()
    steering = SteeringSync(connect_redis(config), config, worker, in_process, runner.saes)
    steering.start()
    return in_process, ModelFacts.of(runner, in_process), steering


@worker_shutdown.connect
def stop_engine(**_: object) -> None:
    for bulk in _bulk:
        bulk.stop()
    for runtime in _runtime:
        runtime.engine.stop()  # first, so that the output processor still streams the aborts it sends
        runtime.handler.close()
        runtime.lease.stop()
        if runtime.steering is not None:
            runtime.steering.stop()
        runtime.reaper.stop()


@celery.task(name=GENERATE_TASK)
def generate(payload: dict) -> None:
    if not _runtime:
        raise RuntimeError("the model is not loaded: run this module with `celery -A worker.app worker`")
    _runtime[0].handler.handle(GenerateRequest.from_dict(payload))


@celery.task(name=BATCH_CHUNK_TASK)
def run_batch_chunk(payload: dict) -> None:
    if not _bulk:
        raise RuntimeError("the model is not loaded: run this module with `celery -A worker.app worker`")
    _bulk[0].chunks.run(ChunkTask.from_dict(payload))


@celery.task(name=EMBED_TASK)
def embed(payload: dict) -> None:
    if not _embeddings:
        raise RuntimeError("the model is not loaded: run this module with `celery -A worker.app worker`")
    _embeddings[0].handle(EmbedRequest.from_dict(payload))
