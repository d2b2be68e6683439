"""The engine process's side: it loads the model, runs `ContinuousEngine` and the steering sync beside it, takes
submissions and cancels from one pipe and sends each batch of outputs up the other. It ends when the worker sends
STOP or closes its pipe (the worker died): a worker's death never leaves its engine running."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from tasks.config import Config
from tasks.logs import configure_logging
from tasks.streams.redis_keys import connect_redis
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.embedding.jobs import EmbeddingRequest, EmbeddingResult
from worker.engine.interface import EngineOutput, EngineRequest
from worker.engine.model_facts import ModelFacts
from worker.engine.model_runner import ModelRunner
from worker.engine_process import wire
from worker.serving.steering_sync import SteeringSync

logger = logging.getLogger(__name__)
HEARTBEAT_S = 1.0  # load and stats go up at least this often, so an idle worker's published load stays current
LOAD_INTERVAL_S = 0.2  # and at most this often with outputs: what reads them (the lease, /metrics) reads every second
STOP_TIMEOUT_S = 60.0


class StepSender:
    """Gathers the engine's callbacks (on the engine thread) and sends them up in one message per batch, from a thread
    of its own, with the engine's load and stats as of the send."""

    def __init__(self, engine: ContinuousEngine, connection: Connection) -> None:
        self._engine = engine
        self._connection = connection
        self._ready = threading.Condition()
        self._outputs: list[EngineOutput] = []
        self._embeddings: list[EmbeddingResult] = []
        self._is_stopping = False
        self._load_sent_at = 0.0  # monotonic seconds
        self._thread = threading.Thread(target=self._send_forever, name="engine-step-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def on_output(self, output: EngineOutput) -> None:
        with self._ready:
            self._outputs.append(output)  # encoded on the sender's thread, not in the engine's step
            self._ready.notify()

    def on_embedding(self, result: EmbeddingResult) -> None:
        with self._ready:
            self._embeddings.append(result)
            self._ready.notify()

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
                outputs, embeddings, is_last = self._outputs, self._embeddings, self._is_stopping
                self._outputs, self._embeddings = [], []
            fields: dict[str, Any] = {
                "outputs": [output.to_dict() for output in outputs],
                "embeddings": [result.to_dict() for result in embeddings],
            }
            now = time.monotonic()
            if now - self._load_sent_at >= LOAD_INTERVAL_S or is_last or not (outputs or embeddings):
                fields.update(load=self._engine.load().to_dict(), stats=self._engine.stats.to_dict())
                self._load_sent_at = now
            try:
                wire.send(self._connection, wire.STEP, **fields)
            except OSError:  # the worker is gone: the reader sees its pipe close and stops the engine
                return
            if is_last:
                return


def serve_engine(environ: dict[str, str], worker: str, requests: Connection, steps: Connection) -> None:
    """The engine process's main: `environ` is the worker's Config as `Config.to_env` writes it."""
    config = Config.from_env(environ)
    configure_logging(config)
    try:
        runner = ModelRunner(config)
        engine = ContinuousEngine(runner, config)
        engine.start()
        steering = SteeringSync(connect_redis(config), config, worker, engine, runner.saes)
        steering.start()
    except Exception as exc:  # the worker's start fails with the reason (a refused model, a missing package)
        logger.exception("the engine process could not start %s", config.model)
        wire.send(steps, wire.FAILED, error=f"{type(exc).__name__}: {exc}")
        return
    facts = ModelFacts.of(runner, engine)
    wire.send(steps, wire.READY, facts=facts.to_dict())
    sender = StepSender(engine, steps)  # from here on the sender's thread is the only writer of `steps`
    sender.start()
    try:
        take_requests(engine, sender, requests, config.worker_threads)
    finally:
        steering.stop()
        engine.stop(STOP_TIMEOUT_S)  # its aborts go up before the last message
        sender.stop()
    end_stopped_process()


def end_stopped_process() -> NoReturn:
    """Exit code 0 once the engine has stopped and its last message is sent, without the interpreter's teardown: after
    an orderly stop the process sometimes aborted there ("terminate called without an active exception", exit code -6,
    in full test runs under load: a native library's thread still alive when C++ destructors ran). Nothing is left to
    it: the engine thread's end kills its grammar compile processes (one still running past STOP_TIMEOUT_S ends at its
    pipe's EOF, after its compile), and the forkserver and resource tracker end when this process's ends of their
    pipes close."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def take_requests(engine: ContinuousEngine, sender: StepSender, requests: Connection, num_threads: int) -> None:
    """Until STOP, or the worker's end of the pipe closes."""
    submissions = Submissions(engine, sender, num_threads)
    try:
        while True:
            try:
                message = wire.receive(requests)
            except EOFError:
                logger.warning("the worker closed the engine's pipe: stopping the engine")
                return
            kind = message["kind"]
            if kind == wire.SUBMIT:
                submissions.submit(EngineRequest.from_dict(message["request"]))
            elif kind == wire.CANCEL:
                submissions.cancel(message["request_id"])
            elif kind == wire.EMBED:
                engine.submit_embedding(EmbeddingRequest.from_dict(message["request"]), sender.on_embedding)
            elif kind == wire.STOP:
                return
    finally:
        submissions.close()


class Submissions:
    """Submits to the engine. `ContinuousEngine.submit` compiles a request's grammar and loads its SAEs on the calling
    thread, which in the worker was the request's own Celery thread; here one reader takes every request, so a request
    with a grammar, steering or a monitor is submitted from a pool instead, and a slow compile holds up no other request
    or cancel. A cancel that arrives while its request is still being submitted is applied once the submit returns."""

    def __init__(self, engine: ContinuousEngine, sender: StepSender, num_threads: int) -> None:
        self._engine = engine
        self._sender = sender
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="engine-submit")
        self._lock = threading.Lock()
        self._in_pool: dict[str, bool] = {}  # request id -> whether a cancel came while it was being submitted

    def submit(self, request: EngineRequest) -> None:
        if request.grammar is None and request.steering is None and request.monitor is None:
            self._engine.submit(request, self._sender.on_output)
            return
        with self._lock:
            self._in_pool[request.request_id] = False
        self._pool.submit(self._submit_from_pool, request)

    def cancel(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._in_pool:
                self._in_pool[request_id] = True
                return
        self._engine.cancel(request_id)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _submit_from_pool(self, request: EngineRequest) -> None:
        try:
            self._engine.submit(request, self._sender.on_output)
        finally:
            with self._lock:
                is_cancelled = self._in_pool.pop(request.request_id)
            if is_cancelled:
                self._engine.cancel(request.request_id)
