"""One thread that writes, in one call, everything handed to it while its previous write ran; each caller waits for its
own answer. The requests of a burst start together and end together: each one's claim, and each one's result,
committed alone cost a transaction apiece and queued on the database's write lock (on SQLite, beside the api's INSERTs
of the same burst, whose process a waiter holds up)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)
Item = TypeVar("Item")
Answer = TypeVar("Answer")
MAX_ITEMS_PER_WRITE = 256  # a bound on one transaction's size; more waiting are the next write's


@dataclass(eq=False)
class _Waiting(Generic[Item, Answer]):
    item: Item
    answer: Answer | Exception | None = None
    done: threading.Event = field(default_factory=threading.Event)


class WrittenTogether(Generic[Item, Answer]):
    """`write` takes the items waiting and returns one answer per item, in order: an exception as an answer is raised
    in that item's caller; an exception `write` raises is raised in every caller of that write."""

    def __init__(self, name: str, write: Callable[[list[Item]], Sequence[Answer | Exception]]) -> None:
        self._name = name
        self._write = write
        self._has_work = threading.Condition()
        self._waiting: list[_Waiting[Item, Answer]] = []
        self._is_stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the thread once every item handed over so far is written."""
        with self._has_work:
            self._is_stopping = True
            self._has_work.notify()
        self._thread.join()

    @property
    def num_waiting(self) -> int:
        """Items handed over and not yet taken by a write."""
        with self._has_work:
            return len(self._waiting)

    def submit(self, item: Item) -> Answer:
        """`item`'s answer, once written with the others waiting; raises what kept it from being written."""
        waiting: _Waiting[Item, Answer] = _Waiting(item)
        with self._has_work:
            if self._is_stopping:
                raise RuntimeError(f"the worker's {self._name} has stopped")
            self._waiting.append(waiting)
            self._has_work.notify()
        waiting.done.wait()
        if isinstance(waiting.answer, Exception):
            raise waiting.answer
        return waiting.answer  # type: ignore[return-value]  # set by the writer before `done`

    def _run(self) -> None:
        while True:
            with self._has_work:
                self._has_work.wait_for(lambda: self._waiting or self._is_stopping)
                taken, self._waiting = self._waiting[:MAX_ITEMS_PER_WRITE], self._waiting[MAX_ITEMS_PER_WRITE:]
                if not taken and self._is_stopping:
                    return
            answers = self._answers([waiting.item for waiting in taken])
            for waiting, answer in zip(taken, answers, strict=True):
                waiting.answer = answer
                waiting.done.set()

    def _answers(self, items: list[Item]) -> Sequence[Answer | Exception]:
        try:
            return self._write(items)
        except Exception as exc:  # the database or Redis failed for all of them: each caller raises it
            logger.warning("%s: writing %d failed: %s", self._name, len(items), exc)
            return [exc] * len(items)
