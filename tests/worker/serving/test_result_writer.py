"""The worker's result writer: results handed over while a write runs go out together in the next one, each caller
gets its own outcome, and a failure of the write reaches every caller in it."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from tasks.config import Config
from tasks.store.finish_together import Outcome, RequestResult
from worker.serving import result_writer
from worker.serving.result_writer import ResultWriter


def test_results_waiting_are_written_together_and_each_caller_gets_its_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[list[str]] = []
    first_write_started, release_first_write = threading.Event(), threading.Event()

    def finish_requests(
        _sessions: object, _client: object, _config: object, results: Sequence[RequestResult]
    ) -> list[Outcome]:
        writes.append([result.request_id for result in results])
        if len(writes) == 1:
            first_write_started.set()
            release_first_write.wait(5)
        return [not result.request_id.endswith("taken") for result in results]

    monkeypatch.setattr(result_writer, "finish_requests", finish_requests)
    writer = ResultWriter(None, None, Config())  # type: ignore[arg-type]
    writer.start()
    outcomes: dict[str, bool] = {}

    def record(request_id: str) -> None:
        outcomes[request_id] = writer.record(RequestResult(request_id, 1))

    first = threading.Thread(target=record, args=("a",))
    first.start()
    assert first_write_started.wait(5)
    others = [threading.Thread(target=record, args=(request_id,)) for request_id in ("b", "c-taken", "d")]
    for thread in others:
        thread.start()
    deadline = time.monotonic() + 5
    while writer.num_waiting < 3:  # all three wait while the first write runs
        assert time.monotonic() < deadline, "the three results did not reach the writer"
        time.sleep(0.01)
    release_first_write.set()
    for thread in [first, *others]:
        thread.join(5)
    writer.stop()
    assert writes == [["a"], ["b", "c-taken", "d"]]
    assert outcomes == {"a": True, "b": True, "c-taken": False, "d": True}


def test_a_failed_write_raises_in_every_caller_in_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def finish_requests(*_args: object) -> list[Outcome]:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(result_writer, "finish_requests", finish_requests)
    writer = ResultWriter(None, None, Config())  # type: ignore[arg-type]
    writer.start()
    with pytest.raises(ConnectionError, match="redis is down"):
        writer.record(RequestResult("a", 1))
    writer.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        writer.record(RequestResult("b", 1))
