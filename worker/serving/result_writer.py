"""One thread per worker records the results of the chat requests that end: every result waiting when it wakes goes
into SQL in one transaction and out as FINAL events in one Redis round trip (`tasks/store/finish_together.py`), while
each request's thread waits for its own outcome. Requests of a burst end together, and each used to commit alone."""

from __future__ import annotations

import redis

from tasks.config import Config
from tasks.store.db import SessionFactory
from tasks.store.finish_together import Outcome, RequestResult, finish_requests
from worker.serving.written_together import WrittenTogether


class ResultWriter:
    def __init__(self, sessions: SessionFactory, client: redis.Redis, config: Config) -> None:
        self._sessions = sessions
        self._client = client
        self._config = config
        self._writes: WrittenTogether[RequestResult, bool] = WrittenTogether("result-writer", self._write)

    def start(self) -> None:
        self._writes.start()

    def stop(self) -> None:
        """Ends the thread once every result handed over so far is written."""
        self._writes.stop()

    @property
    def num_waiting(self) -> int:
        return self._writes.num_waiting

    def record(self, result: RequestResult) -> bool:
        """`finish_request`'s answer for this result, once written with the others waiting: True if recorded, False
        if another writer had recorded one; raises what kept this one from being recorded."""
        return self._writes.submit(result)

    def _write(self, results: list[RequestResult]) -> list[Outcome]:
        return finish_requests(self._sessions, self._client, self._config, results)
