"""What other threads hand the engine thread: submissions, cancellations, the worker-wide monitor and a stop.

`submit`, `cancel`, `set_worker_monitor` and `stop` may be called from any thread; `take` is the engine thread's one
place to wait, and it returns everything that arrived since its last call at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from worker.engine.embedding.jobs import EmbeddingJob
from worker.engine.sequence import Submission
from worker.steering.worker_monitor import WorkerMonitor


@dataclass(frozen=True)
class NewWork:
    submissions: list[Submission]
    cancelled: set[str]
    worker_monitor: WorkerMonitor | None
    embeddings: list[EmbeddingJob]


class EngineInbox:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._submissions: list[Submission] = []
        self._cancelled: set[str] = set()
        self._embeddings: list[EmbeddingJob] = []
        self._active: set[str] = set()  # submitted and not yet finished
        self._worker_monitor: WorkerMonitor | None = None
        self._is_stopping = False

    def submit(self, submission: Submission) -> None:
        request_id = submission.request.request_id
        with self._cond:
            if self._is_stopping:
                raise RuntimeError("the engine is stopping and takes no new requests")
            if request_id in self._active:
                raise ValueError(f"request {request_id!r} is already in the engine")
            self._active.add(request_id)
            self._submissions.append(submission)
            self._cond.notify_all()

    def submit_embedding(self, job: EmbeddingJob) -> None:
        with self._cond:
            if self._is_stopping:
                raise RuntimeError("the engine is stopping and takes no new requests")
            self._embeddings.append(job)
            self._cond.notify_all()

    def cancel(self, request_id: str) -> None:
        with self._cond:
            if request_id in self._active:
                self._cancelled.add(request_id)
                self._cond.notify_all()

    def set_worker_monitor(self, monitor: WorkerMonitor | None) -> None:
        with self._cond:
            self._worker_monitor = monitor

    def stop(self) -> None:
        """Refuses later submissions and wakes the engine thread so that it ends."""
        with self._cond:
            self._is_stopping = True
            self._cond.notify_all()

    def take(self, has_work: Callable[[], bool]) -> NewWork | None:
        """Waits until something arrived or `has_work()`; None once the engine is stopping."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._submissions or self._cancelled or self._embeddings or has_work() or self._is_stopping
            )
            if self._is_stopping:
                return None
            submissions, self._submissions = self._submissions, []
            cancelled, self._cancelled = self._cancelled, set()
            embeddings, self._embeddings = self._embeddings, []
            return NewWork(submissions, cancelled, self._worker_monitor, embeddings)

    def take_unadmitted(self) -> list[Submission]:
        """The submissions the engine thread never took: on the way out, each still owes its caller an output."""
        with self._cond:
            submissions, self._submissions = self._submissions, []
            return submissions

    def take_unrun_embeddings(self) -> list[EmbeddingJob]:
        """The embedding jobs the engine thread never took, on the way out, as `take_unadmitted`."""
        with self._cond:
            embeddings, self._embeddings = self._embeddings, []
            return embeddings

    def finished(self, request_id: str) -> None:
        """The request's last output is going out: its id may be submitted again, a late cancel is moot."""
        with self._cond:
            self._active.discard(request_id)
            self._cancelled.discard(request_id)
