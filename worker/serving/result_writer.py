"""One thread per worker records the results of the chat requests that end: every result waiting when it wakes goes
into SQL in one transaction and out as FINAL events in one Redis round trip (`tasks/store/finish_together.py`), while
each request's thread waits for its own outcome. Requests of a burst end together, and each used to commit alone."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import redis

from tasks.config import Config
from tasks.store.db import SessionFactory
from tasks.store.finish_together import Outcome, RequestResult, finish_requests

logger = logging.getLogger(__name__)
MAX_RESULTS_PER_WRITE = 256  # a bound on one transaction's size; more waiting are the next write's


@dataclass(eq=False)
class _Waiting:
    result: RequestResult
    outcome: Outcome | None = None
    done: threading.Event = field(default_factory=threading.Event)


class ResultWriter:
    def __init__(self, sessions: SessionFactory, client: redis.Redis, config: Config) -> None:
        self._sessions = sessions
        self._client = client
        self._config = config
        self._has_work = threading.Condition()
        self._waiting: list[_Waiting] = []
        self._is_stopping = False
        self._thread = threading.Thread(target=self._run, name="result-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread once every result handed over so far is written."""
        with self._has_work:
            self._is_stopping = True
            self._has_work.notify()
        self._thread.join()

    def record(self, result: RequestResult) -> bool:
        """`finish_request`'s answer for this result, once written with the others waiting: True if recorded, False
        if another writer had recorded one; raises what kept this one from being recorded."""
        waiting = _Waiting(result)
        with self._has_work:
            if self._is_stopping:
                raise RuntimeError("the worker's result writer has stopped")
            self._waiting.append(waiting)
            self._has_work.notify()
        waiting.done.wait()
        assert waiting.outcome is not None, "the writer sets an outcome before `done`"
        if isinstance(waiting.outcome, Exception):
            raise waiting.outcome
        return waiting.outcome

    def _run(self) -> None:
        while True:
            with self._has_work:
                self._has_work.wait_for(lambda: self._waiting or self._is_stopping)
                taken, self._waiting = self._waiting[:MAX_RESULTS_PER_WRITE], self._waiting[MAX_RESULTS_PER_WRITE:]
                if not taken and self._is_stopping:
                    return
            outcomes = self._write(taken)
            for waiting, outcome in zip(taken, outcomes, strict=True):
                waiting.outcome = outcome
                waiting.done.set()

    def _write(self, taken: list[_Waiting]) -> list[Outcome]:
        try:
            return finish_requests(self._sessions, self._client, self._config, [waiting.result for waiting in taken])
        except Exception as exc:  # Redis or the database failed for all of them: each request's thread raises it
            logger.warning("writing %d results failed: %s", len(taken), exc)
            return [exc] * len(taken)
