"""The engine process's side: it loads the model, runs `ContinuousEngine` and the steering sync beside it, takes
submissions and cancels from one pipe and sends each batch of outputs up the other. It ends when the worker sends
STOP or closes its pipe (the worker died): a worker's death never leaves its engine running."""

from __future__ import annotations

import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import NoReturn

from tasks.config import Config
from tasks.logs import configure_logging
from tasks.streams.redis_keys import connect_redis
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.embedding.jobs import EmbeddingRequest
from worker.engine.interface import EngineRequest
from worker.engine.model_facts import ModelFacts
from worker.engine.model_runner import ModelRunner
from worker.engine_process import wire
from worker.engine_process.step_sender import StepSender
from worker.serving.steering_sync import SteeringSync

logger = logging.getLogger(__name__)
STOP_TIMEOUT_S = 60.0


def serve_engine(environ: dict[str, str], worker: str, requests: Connection, steps: Connection) -> None:
    """The engine process's main: `environ` is the worker's Config as `Config.to_env` writes it."""
    config = Config.from_env(environ)
    configure_logging(config)
    try:
        runner = ModelRunner(config)
        sender = StepSender(steps)  # every message up `steps` after READY goes through it
        engine = ContinuousEngine(runner, config, step_scope=sender.step_scope)
        engine.start()
        steering = SteeringSync(connect_redis(config), config, worker, engine, runner.saes)
        steering.start()
    except Exception as exc:  # the worker's start fails with the reason (a refused model, a missing package)
        logger.exception("the engine process could not start %s", config.model)
        wire.send(steps, wire.FAILED, error=f"{type(exc).__name__}: {exc}")
        return
    facts = ModelFacts.of(runner, engine)
    wire.send(steps, wire.READY, facts=facts.to_dict())
    sender.start(engine)
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
