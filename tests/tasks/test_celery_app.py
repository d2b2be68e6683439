"""What the api puts on a model's queue, read back from a real Redis: the request as the task's one argument, shown
as its id (not rendered from the whole request), and no task events asked of the api or the workers."""

from __future__ import annotations

import base64
import json
import uuid

import redis

from tasks.celery_app import GENERATE_TASK, create_celery, enqueue_generate
from tasks.config import Config
from tasks.messages.generation import Endpoint, GenerateRequest, SamplingParams


def test_a_generate_task_carries_the_request_and_shows_its_id(redis_url: str) -> None:
    run = uuid.uuid4().hex[:8]
    config = Config(redis_url=redis_url, redis_prefix=f"test-{run}:", interactive_queue=f"test-{run}-interactive")
    request = GenerateRequest(f"cmpl-{run}", Endpoint.COMPLETIONS, "tiny", list(range(500)), SamplingParams(16), 7)
    client = redis.Redis.from_url(redis_url)
    queue = config.interactive_queue_of("tiny")
    try:
        enqueue_generate(create_celery(config), config, request)
        [raw] = client.lrange(queue, 0, -1)
    finally:
        client.delete(queue)
    message = json.loads(raw)
    headers = message["headers"]
    assert headers["task"] == GENERATE_TASK and headers["argsrepr"] == repr([request.request_id])
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert args == [request.to_dict()] and kwargs == {}


def test_no_task_events_unless_a_monitor_turns_them_on() -> None:
    """Flower turns the workers' events on while it runs (`enable_events`); until then none is published in line
    before a task runs, nor by the api after its enqueue."""
    conf = create_celery(Config()).conf
    assert conf.worker_send_task_events is False and conf.task_send_sent_event is False
