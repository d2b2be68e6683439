"""The worker's side of its engine process: the engine's interface (`submit`, `cancel`, `submit_embedding`, `stats`,
`load`, ...) over two pipes, with one receiver thread that calls each request's callback as its outputs come up."""

from __future__ import annotations

import logging
import multiprocessing
import threading
from typing import Any

from tasks.config import Config
from worker.engine.embedding.jobs import EmbeddingCallback, EmbeddingRequest, EmbeddingResult
from worker.engine.interface import EngineOutput, EngineRequest, OutputCallback
from worker.engine.model_facts import ModelFacts
from worker.engine.stats import EngineLoad, EngineStats
from worker.engine_process import wire
from worker.engine_process.child import serve_engine

logger = logging.getLogger(__name__)
STOP_TIMEOUT_S = 90.0


class EngineProcessError(RuntimeError):
    """The engine process could not start; the message is its reason."""


class EngineProcess:
    """Implements what the worker uses of `ContinuousEngine`. `submit`, `cancel` and `submit_embedding` may be called
    from any thread; callbacks run on the receiver thread, in the order the engine made them."""

    def __init__(self, config: Config, worker: str) -> None:
        # spawn: a fork of a worker that has started threads (and perhaps CUDA) is not safe to run torch in
        context = multiprocessing.get_context("spawn")
        steps, child_steps = context.Pipe(duplex=False)
        child_requests, self._requests = context.Pipe(duplex=False)
        # not daemonic: the engine compiles grammars in processes of its own
        self._process = context.Process(
            target=serve_engine, args=(config.to_env(), worker, child_requests, child_steps), name="engine"
        )
        self._process.start()
        child_requests.close()
        child_steps.close()
        self._steps = steps
        self.facts = self._wait_until_ready()
        self._send_lock = threading.Lock()
        self._callbacks: dict[str, OutputCallback] = {}
        self._embedding_callbacks: dict[str, EmbeddingCallback] = {}
        self._load = EngineLoad(0, {}, self.facts.num_blocks, self.facts.num_blocks)
        self._stats = EngineStats()
        self._is_stopping = False
        self._receiver = threading.Thread(target=self._receive_forever, name="engine-receiver", daemon=True)
        self._receiver.start()

    def _wait_until_ready(self) -> ModelFacts:
        try:
            message = wire.receive(self._steps)
        except EOFError:
            self._process.join()
            exit_code = self._process.exitcode
            raise EngineProcessError(f"the engine process ended at start (exit code {exit_code})") from None
        if message["kind"] == wire.FAILED:
            self._process.join()
            raise EngineProcessError(message["error"])
        facts = ModelFacts.from_dict(message["facts"])
        logger.info("engine process %d ready: %s", self._process.pid, facts)
        return facts

    # --- the engine's interface ---

    def submit(self, request: EngineRequest, on_output: OutputCallback) -> None:
        self._callbacks[request.request_id] = on_output
        self._send(wire.SUBMIT, request=request.to_dict())

    def submit_embedding(self, request: EmbeddingRequest, on_done: EmbeddingCallback) -> None:
        self._embedding_callbacks[request.request_id] = on_done
        self._send(wire.EMBED, request=request.to_dict())

    def cancel(self, request_id: str) -> None:
        # a request whose last output has been delivered (or that was never submitted) has nothing left to abort:
        # its end's cancels (the worker cancels each choice as it lets go of it) cost no message and no send lock
        if request_id in self._callbacks:
            self._send(wire.CANCEL, request_id=request_id)

    def is_alive(self) -> bool:
        return self._process.is_alive() and self._receiver.is_alive()

    def stop(self, timeout_s: float | None = None) -> None:
        """Aborts everything in flight (the aborts reach their callbacks) and ends the engine process."""
        self._is_stopping = True
        self._send(wire.STOP)
        self._receiver.join(timeout_s or STOP_TIMEOUT_S)
        self._process.join(timeout_s or STOP_TIMEOUT_S)
        if self._process.is_alive():
            logger.warning("the engine process did not stop in time: killing it")
            self._process.kill()
            self._process.join()
        self._requests.close()

    @property
    def stats(self) -> EngineStats:
        return self._stats

    def load(self) -> EngineLoad:
        return self._load

    @property
    def block_size(self) -> int:
        return self.facts.block_size

    # --- the pipes ---

    def _send(self, kind: str, **fields: Any) -> None:
        with self._send_lock:
            try:
                wire.send(self._requests, kind, **fields)
            except OSError:  # the engine process has ended: is_alive() says so, and the request's thread fails it
                logger.warning("the engine process is gone: %s not sent", kind)

    def _receive_forever(self) -> None:
        while True:
            try:
                message = wire.receive(self._steps)
            except (EOFError, OSError):
                if not self._is_stopping:
                    logger.error("the engine process ended (exit code %s)", self._process.exitcode)
                return
            if "load" in message:  # sent with outputs at most every LOAD_INTERVAL_S, and on every heartbeat
                self._load = EngineLoad.from_dict(message["load"])
                self._stats = EngineStats.from_dict(message["stats"])
            for data in message["outputs"]:
                self._deliver(EngineOutput.from_dict(data))
            for data in message["embeddings"]:
                result = EmbeddingResult.from_dict(data)
                on_done = self._embedding_callbacks.pop(result.request_id, None)
                if on_done is not None:
                    on_done(result)

    def _deliver(self, output: EngineOutput) -> None:
        take = self._callbacks.pop if output.is_finished else self._callbacks.get
        on_output = take(output.request_id, None)
        if on_output is None:
            return
        try:
            on_output(output)
        except Exception:  # one request's callback must not end the others' outputs
            logger.exception("the output callback of %s failed", output.request_id)
