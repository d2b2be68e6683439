"""Redis SIGKILLed and restarted (AOF on) in the middle of a bulk batch: the worker and the api stay up, every line
ends with exactly one result or one error in the batch's output and error files, the batch reaches a terminal
status, and a batch submitted once Redis is back completes."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from scripts.stack import Stack, launcher_key
from tasks.batches.models import BatchLine, LineStatus
from tasks.store.db import make_db_engine, make_session_factory
from tests.conftest import make_test_config
from tests.faults.test_redis_restart import RestartableRedis
from tests.service.batch_helpers import chat_line, read_jsonl, submit, wait_for_end, wait_until

NUM_LINES = 40
logger = logging.getLogger(__name__)


@pytest.fixture
def redis_and_stack(tiny_model_dir: Path, tmp_path: Path) -> Iterator[tuple[RestartableRedis, Stack]]:
    server = RestartableRedis(tmp_path, append_only=True)
    server.start()
    config = make_test_config(
        tiny_model_dir,
        server.url,
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        worker_lease_s=2.0,
        batch_line_lease_s=3.0,
        batch_reaper_interval_s=0.5,
        batch_dispatch_timeout_s=6.0,
        batch_chunk_size=4,
        batch_chunks_in_flight=2,
    )
    stack = Stack(config, log_dir=tmp_path / "logs", api_key=launcher_key(config, "test-admin"))
    stack.start()
    yield server, stack
    stack.stop()
    server.kill()


def line_statuses(stack: Stack, batch_id: str) -> collections.Counter[str]:
    engine = make_db_engine(stack.config.database_url)
    try:
        with make_session_factory(engine)() as session:
            rows = session.scalars(select(BatchLine.status).where(BatchLine.batch_id == batch_id))
            return collections.Counter(rows)
    finally:
        engine.dispose()


def wait_for_mid_batch(stack: Stack, batch_id: str) -> collections.Counter[str]:
    """Until some lines have finished and some are running: the kill then lands mid-batch, mid-line."""
    deadline = time.monotonic() + 120
    while True:
        counts = line_statuses(stack, batch_id)
        if counts[LineStatus.COMPLETED.value] >= 4 and counts[LineStatus.RUNNING.value] > 0:
            return counts
        assert time.monotonic() < deadline, f"the batch never got under way: {counts}"
        time.sleep(0.05)


def test_redis_restart_mid_batch_ends_every_line_once(redis_and_stack: tuple[RestartableRedis, Stack]) -> None:
    server, stack = redis_and_stack
    custom_ids = [f"line-{i}" for i in range(NUM_LINES)]
    lines = [chat_line(stack, custom_id, max_tokens=80, ignore_eos=True) for custom_id in custom_ids]
    batch_id = submit(stack, lines)
    at_kill = wait_for_mid_batch(stack, batch_id)
    server.kill()
    time.sleep(3)
    server.start()

    batch = wait_for_end(stack, batch_id, timeout_s=300)
    assert stack.dead_process() is None, "a process of the stack exited when Redis restarted"
    outputs = read_jsonl(stack, batch.output_file_id)
    errors = read_jsonl(stack, batch.error_file_id)
    answered = collections.Counter(line["custom_id"] for line in outputs + errors)
    assert sorted(answered) == sorted(custom_ids), "every line has an answer"
    assert set(answered.values()) == {1}, f"lines answered twice: {[c for c, n in answered.items() if n > 1]}"
    counts = batch.request_counts
    assert (counts.total, counts.completed + counts.failed) == (NUM_LINES, NUM_LINES)
    assert (len(outputs), len(errors)) == (counts.completed, counts.failed)

    after = submit(stack, [chat_line(stack, f"after-{i}") for i in range(4)])
    after_batch = wait_until(stack, after, lambda b: b.status in ("completed", "failed"), timeout_s=120)
    assert after_batch.status == "completed" and after_batch.request_counts.completed == 4, after_batch
    message = "Redis restart mid-batch: lines at the kill %s; batch %s with %d results and %d errors"
    logger.info(message, dict(at_kill), batch.status, len(outputs), len(errors))
