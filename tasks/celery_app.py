"""The Celery app, built from the same Config in the api and the worker, and the task names they share."""

from __future__ import annotations

from celery import Celery

from tasks.batches.messages import ChunkTask
from tasks.config import Config
from tasks.messages.embeddings import EmbedRequest
from tasks.messages.generation import GenerateRequest
from tasks.redis_transport import TRANSPORT

GENERATE_TASK = "steerbatch.generate"
BATCH_CHUNK_TASK = "steerbatch.batch_chunk"
EMBED_TASK = "steerbatch.embed"


def create_celery(config: Config) -> Celery:
    app = Celery("steerbatch", broker=config.redis_url)
    app.conf.broker_transport = TRANSPORT  # survives a Redis restart (see tasks/redis_transport.py)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # Threads, not processes: every task thread hands work to the one engine that owns the device.
        worker_pool="threads",
        worker_concurrency=config.worker_threads,
        task_default_queue=config.interactive_queue_of(config.model_name),
        # No task events unless someone watches: each is a PUBLISH in line before a request's first token (the api's
        # "sent" after its enqueue, the worker's "received" and "started" before the task runs). Flower turns the
        # workers' events on itself while it runs (its `enable_events`, on by default); it shows a task from when a
        # worker receives it.
        worker_send_task_events=False,
        task_send_sent_event=False,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=3,
        # "priority": a worker polls its queues in the order given (interactive first) instead of round robin.
        broker_transport_options={
            "socket_connect_timeout": 2,
            "visibility_timeout": 3600,
            "queue_order_strategy": "priority",
        },
        # Fail fast when Redis is down so the api can answer 503 instead of hanging.
        task_publish_retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.5},
        worker_hijack_root_logger=False,
    )
    return app


def enqueue_generate(app: Celery, config: Config, request: GenerateRequest) -> None:
    """On the interactive queue of the request's model, which only that model's workers consume."""
    _send(app, GENERATE_TASK, request.to_dict(), config.interactive_queue_of(request.model), request.request_id)


def enqueue_embed(app: Celery, config: Config, request: EmbedRequest) -> None:
    """On the interactive queue of the request's model, like a chat request: the worker holding the model embeds."""
    _send(app, EMBED_TASK, request.to_dict(), config.interactive_queue_of(request.model), request.request_id)


def enqueue_chunk(app: Celery, config: Config, chunk: ChunkTask) -> None:
    app.send_task(BATCH_CHUNK_TASK, args=[chunk.to_dict()], queue=config.bulk_queue_of(chunk.model))


def _send(app: Celery, task: str, payload: dict, queue: str, request_id: str) -> None:
    """The task with a request as its one argument, shown as the request's id (what Flower lists as its args): left
    to itself, Celery builds that text with `saferepr` over the whole request, a prompt's every token id included,
    which cost the api more CPU than the publish."""
    app.send_task(task, args=[payload], queue=queue, argsrepr=repr([request_id]), kwargsrepr="{}")
