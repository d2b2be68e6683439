"""The engine process's one way up to the worker: each batch of the engine's outputs in one message, with the engine's
load and stats as of the send.

A step's outputs go up from the engine thread itself, as the step ends (`step_scope`), in one message. They used to be
handed to a sender thread, woken by the step's first output: that thread then took the GIL in the middle of the
engine's next step (the GIL changes hands at every torch call), and the engine thread slept until it had it back,
106 to 161 times in a 32-stream round of 128 tokens; sent as the step ends, 5 to 28 (docs/perf-notes.md, Round 9).
Outputs that arrive outside a step (a cancel applied between steps, a submission refused on the reader's thread, an
embedding) and the idle heartbeat of the load still go up from the sender's thread."""

from __future__ import annotations

import fcntl
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.embedding.jobs import EmbeddingResult
from worker.engine.interface import EngineOutput
from worker.engine_process import wire

logger = logging.getLogger(__name__)
# The pipe's buffer, raised from Linux's 64 KiB: a step's send blocks the engine thread once the worker's receiver is
# that far behind, and 64 KiB was about 16 steps of 64 streams, which a worker busy starting a burst's tasks fell behind
# by (the engine thread asleep in the pipe's write for 200 ms of a 1.2 s round). 1 MiB, Linux's default most an
# unprivileged process may set, is some 250 such steps; past that the engine waiting is the backpressure it should be.
PIPE_BUFFER_BYTES = 1 << 20
HEARTBEAT_S = 1.0  # load and stats go up at least this often, so an idle worker's published load stays current
LOAD_INTERVAL_S = 0.2  # and at most this often with outputs: what reads them (the lease, /metrics) reads every second


class StepSender:
    """`on_output` and `on_embedding` may be called from any thread; `step_scope` is the engine's, on its thread."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        widen_pipe(connection)
        self._engine: ContinuousEngine | None = None  # set by `start`: the load and stats it sends are its
        self._ready = threading.Condition()
        self._outputs: list[EngineOutput] = []
        self._embeddings: list[EmbeddingResult] = []
        self._in_step = False
        self._is_stopping = False
        # One writer of the pipe at a time, and what it takes it sends before the next writer takes: a request's
        # outputs go up in the order the engine gave them, whichever thread sends them.
        self._sending = threading.Lock()
        self._load_sent_at = 0.0  # monotonic seconds
        self._thread = threading.Thread(target=self._send_forever, name="engine-step-sender", daemon=True)

    def start(self, engine: ContinuousEngine) -> None:
        self._engine = engine
        self._thread.start()

    def on_output(self, output: EngineOutput) -> None:
        with self._ready:
            self._outputs.append(output)
            if not self._in_step:  # a step's outputs go up as it ends, from the engine thread
                self._ready.notify()

    def on_embedding(self, result: EmbeddingResult) -> None:
        with self._ready:
            self._embeddings.append(result)
            self._ready.notify()

    @contextmanager
    def step_scope(self) -> Iterator[None]:
        """Around each engine step, on the engine thread: what the step gave goes up in one message as it ends."""
        with self._ready:
            self._in_step = True
        try:
            yield
        finally:
            with self._ready:
                self._in_step = False
            self._send(is_last=False, even_if_empty=False)

    def stop(self) -> None:
        """Returns once everything called back so far has been sent."""
        with self._ready:
            self._is_stopping = True
            self._ready.notify()
        self._thread.join()

    def _send_forever(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._outputs or self._embeddings or self._is_stopping, HEARTBEAT_S)
                is_last = self._is_stopping
            if not self._send(is_last, even_if_empty=True) or is_last:
                return

    def _send(self, is_last: bool, even_if_empty: bool) -> bool:
        """Sends what is waiting; the sender's thread sends even with nothing waiting (its heartbeat carries the load).
        False once the worker is gone (its reader sees the pipe close and stops the engine)."""
        with self._sending:
            with self._ready:
                outputs, embeddings = self._outputs, self._embeddings
                self._outputs, self._embeddings = [], []
            if not (outputs or embeddings or even_if_empty):
                return True
            fields: dict[str, Any] = {
                "outputs": [output.to_dict() for output in outputs],
                "embeddings": [result.to_dict() for result in embeddings],
            }
            now = time.monotonic()
            if now - self._load_sent_at >= LOAD_INTERVAL_S or is_last or not (outputs or embeddings):
                assert self._engine is not None, "started before anything is sent"
                fields.update(load=self._engine.load().to_dict(), stats=self._engine.stats.to_dict())
                self._load_sent_at = now
            try:
                wire.send(self._connection, wire.STEP, **fields)
            except OSError:
                return False
            return True


def widen_pipe(connection: Connection) -> None:
    """`PIPE_BUFFER_BYTES` of buffer in the pipe under `connection`, or as much as this system allows (logged)."""
    try:
        fcntl.fcntl(connection.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BUFFER_BYTES)
    except OSError as exc:  # a lower pipe-max-size, or the user's pipe pages spent: the default buffer still works
        logger.warning("the engine's output pipe keeps its default buffer: %s", exc)
