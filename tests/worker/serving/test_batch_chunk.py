"""The chunk runner on real Redis and SQLite over a scripted engine: all lines submitted at once, one recorded
result per line, stop strings, cancel at the next step, redelivery, a lease taken away, and engine errors."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import select, update
from transformers import PreTrainedTokenizerFast

from tasks.batches.events import set_stop_flag
from tasks.batches.messages import ChunkTask
from tasks.batches.models import BatchLine, BatchRecord, BatchStatus, LineStatus
from tasks.batches.store import dispatch_chunks, new_sortable_id
from tasks.config import Config
from tasks.messages.generation import Endpoint, FinishReason, GenerateRequest, SamplingParams
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tests.batch_rows import accept_rows, queued_line_row
from worker.engine.interface import BULK_PRIORITY, EngineOutput, EngineRequest, OutputCallback
from worker.serving.batch_chunk import ChunkRunner
from worker.serving.batch_stops import StopWatcher
from worker.serving.metrics import ServingMetrics
from worker.text.choice import ENGINE_FAILURE


class ScriptedEngine:
    """Emits each request's `max_tokens` tokens, one per step, from its own thread; cancel ends it with ABORT, and
    the prompt [0] fails."""

    def __init__(self, token_id: int) -> None:
        self.token_id = token_id
        self.submitted: list[EngineRequest] = []
        self.cancel_calls: list[str] = []
        self.max_in_flight = 0
        self._active: dict[str, tuple[EngineRequest, OutputCallback, int]] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def submit(self, request: EngineRequest, on_output: OutputCallback) -> None:
        with self._lock:
            self.submitted.append(request)
            self._active[request.request_id] = (request, on_output, request.sampling.max_tokens)
            self.max_in_flight = max(self.max_in_flight, len(self._active))

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self.cancel_calls.append(request_id)
            if request_id in self._active:
                self._cancelled.add(request_id)

    def is_alive(self) -> bool:
        return not self._stopped.is_set()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(0.005):
            with self._lock:
                active = list(self._active.items())
            for request_id, (request, on_output, remaining) in active:
                self._step(request_id, request, on_output, remaining)

    def _step(self, request_id: str, request: EngineRequest, on_output: OutputCallback, remaining: int) -> None:
        with self._lock:
            is_cancelled = request_id in self._cancelled
            if is_cancelled or remaining <= 1 or request.prompt_token_ids == [0]:
                del self._active[request_id]
            else:
                self._active[request_id] = (request, on_output, remaining - 1)
        if is_cancelled:
            on_output(EngineOutput(request_id, [], FinishReason.ABORT))
        elif request.prompt_token_ids == [0]:
            on_output(EngineOutput(request_id, [], error="the device fell over"))
        else:
            on_output(EngineOutput(request_id, [self.token_id], FinishReason.LENGTH if remaining <= 1 else None))


@pytest.fixture
def setup(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[tuple[Config, ChunkRunner, ScriptedEngine]]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = Config(
        model=str(tiny_model_dir),
        redis_url=redis_url,
        is_redis_embedded=False,
        database_url=database_url,
        redis_prefix=f"test-{uuid.uuid4().hex[:8]}:",
        batch_chunk_size=8,
        batch_line_lease_s=0.3,
    )
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)
    [the] = tokenizer.encode(" the", add_special_tokens=False)
    engine = ScriptedEngine(token_id=the)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    sessions = make_session_factory(make_db_engine(database_url))
    stops = StopWatcher(client, config)
    stops.start()
    metrics = ServingMetrics()
    runner = ChunkRunner(config, engine, tokenizer, client, sessions, "test-worker", metrics, stops, lambda _: None)
    yield config, runner, engine
    stops.stop()
    engine.stop()
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def dispatch(runner: ChunkRunner, lines: list[tuple[list[int], SamplingParams]]) -> ChunkTask:
    batch_id = new_sortable_id("batch_")
    with runner.sessions() as session:
        session.add(
            BatchRecord(
                id=batch_id,
                endpoint="/v1/completions",
                model="tiny",
                input_file_id="file-x",
                completion_window="24h",
                status=BatchStatus.VALIDATING.value,
                created_at=0,
                expires_at=2**31 - 1,
            )
        )
        session.commit()
        rows = [_row(batch_id, line_no, prompt, sampling) for line_no, (prompt, sampling) in enumerate(lines, 1)]
        accept_rows(session, batch_id, rows)
        [chunk] = dispatch_chunks(session, runner.config)
    return chunk


def _row(batch_id: str, line_no: int, prompt: list[int], sampling: SamplingParams) -> dict:
    request = GenerateRequest(f"cmpl-{uuid.uuid4().hex}", Endpoint.COMPLETIONS, "tiny", prompt, sampling, 0)
    return queued_line_row(batch_id, line_no, request)


def ledger(runner: ChunkRunner, chunk: ChunkTask) -> list[BatchLine]:
    with runner.sessions() as session:
        query = select(BatchLine).where(BatchLine.batch_id == chunk.batch_id).order_by(BatchLine.line_no)
        return list(session.scalars(query))


def test_every_line_is_submitted_at_once_at_bulk_priority_and_recorded_once(setup) -> None:  # type: ignore[no-untyped-def]
    _, runner, engine = setup
    chunk = dispatch(runner, [([5, 6, 7], SamplingParams(max_tokens=3 + i)) for i in range(6)])
    runner.run(chunk)
    assert engine.max_in_flight == 6 and {r.priority for r in engine.submitted} == {BULK_PRIORITY}
    rows = ledger(runner, chunk)
    assert [row.status for row in rows] == ["completed"] * 6
    assert [row.completion_tokens for row in rows] == [3, 4, 5, 6, 7, 8]
    assert rows[0].text == runner.tokenizer.decode([engine.token_id] * 3) and rows[0].finish_reason == "length"
    runner.run(chunk)
    assert len(engine.submitted) == 6, "a redelivered chunk runs nothing"
    counted = runner.metrics.registry.get_sample_value  # once each, the redelivery included
    assert counted("steerbatch:batch_lines_finished_total", {"status": "completed"}) == 6
    assert counted("steerbatch:request_success_total", {"finished_reason": "length"}) == 6
    assert counted("steerbatch:generation_tokens_total") == sum(row.completion_tokens for row in rows)
    assert counted("steerbatch:prompt_tokens_total") == 6 * 3


def test_a_stop_string_ends_a_line_and_its_engine_request(setup) -> None:  # type: ignore[no-untyped-def]
    _, runner, engine = setup
    chunk = dispatch(runner, [([5, 6], SamplingParams(max_tokens=1000, stop=("the the the",)))])
    runner.run(chunk)
    [row] = ledger(runner, chunk)
    assert (row.status, row.finish_reason, row.text) == ("completed", "stop", " ")  # " the the the" stops at 1
    assert row.request_id in engine.cancel_calls and row.completion_tokens < 10


def test_cancel_stops_running_lines_at_the_next_step(setup) -> None:  # type: ignore[no-untyped-def]
    config, runner, _ = setup
    chunk = dispatch(runner, [([5], SamplingParams(max_tokens=2)), ([5], SamplingParams(max_tokens=100_000))])
    threading.Timer(0.3, lambda: set_stop_flag(runner.redis, config, chunk.batch_id, LineStatus.CANCELLED)).start()
    runner.run(chunk)
    short, long = ledger(runner, chunk)
    assert (short.status, long.status) == ("completed", "cancelled")
    assert 0 < long.completion_tokens < 100_000


def test_lines_whose_lease_was_taken_are_dropped_not_recorded(setup) -> None:  # type: ignore[no-untyped-def]
    _, runner, _ = setup
    chunk = dispatch(runner, [([5], SamplingParams(max_tokens=100_000))])

    def take_lease() -> None:
        with runner.sessions() as session:
            session.execute(update(BatchLine).where(BatchLine.chunk_id == chunk.chunk_id).values(lease_owner="other#1"))
            session.commit()

    threading.Timer(0.3, take_lease).start()
    runner.run(chunk)
    [row] = ledger(runner, chunk)
    assert (row.status, row.lease_owner, row.text) == ("running", "other#1", None)


def test_an_engine_error_fails_the_line_without_its_internals(setup) -> None:  # type: ignore[no-untyped-def]
    _, runner, _ = setup
    chunk = dispatch(runner, [([0], SamplingParams(max_tokens=4)), ([5], SamplingParams(max_tokens=4))])
    runner.run(chunk)
    failed, completed = ledger(runner, chunk)
    assert failed.status == "failed" and failed.error["message"] == ENGINE_FAILURE  # type: ignore[index]
    assert failed.error["type"] == "server_error"  # type: ignore[index]
    assert completed.status == "completed"
