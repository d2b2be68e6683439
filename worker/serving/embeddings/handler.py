"""One embeddings task in a Celery thread: claim it, have the engine embed its inputs (between steps, batched with
other embedding requests), record the vectors as its result, which ends its stream."""

from __future__ import annotations

import logging
import threading

import numpy as np
import sqlalchemy.exc

from tasks.messages.embeddings import EmbedRequest, encode_vectors
from tasks.messages.generation import ErrorInfo, FinishReason
from tasks.store.finish import RESULT_NOT_RECORDED, finish_request
from worker.engine.embedding.jobs import EmbeddingCallback, EmbeddingRequest, EmbeddingResult
from worker.engine.interface import Engine
from worker.serving.generation import ENGINE_CHECK_S
from worker.serving.task_runner import TaskRunner

logger = logging.getLogger(__name__)


class EmbeddingHandler(TaskRunner):
    def handle(self, request: EmbedRequest) -> None:
        if not self.claim(request.request_id):
            return
        text, error = "", None
        try:
            text, error = self._run(request)
        except Exception as exc:
            logger.exception("embeddings request %s failed in the worker", request.request_id)
            self.metrics.count_error(exc)
            error = ErrorInfo("The worker failed while embedding.", "server_error")
        self._finish(request, text, error)

    def _run(self, request: EmbedRequest) -> tuple[str, ErrorInfo | None]:
        """The stored text of the request's vectors, or the error that ended it."""
        answered = threading.Event()
        results: list[EmbeddingResult] = []

        def on_done(result: EmbeddingResult) -> None:
            results.append(result)
            answered.set()

        submit_embed(self.engine, request, on_done)
        while not answered.wait(ENGINE_CHECK_S):
            if not self.engine.is_alive():
                return "", ErrorInfo("The engine stopped.", "server_error")
        return stored_result(results[0])

    def _record(self, request: EmbedRequest, text: str, error: ErrorInfo | None) -> bool:
        finish_reason = None if error is not None else FinishReason.STOP
        with self.sessions() as session:
            return finish_request(
                session,
                self.redis,
                self.config,
                request.request_id,
                text=text,
                finish_reason=finish_reason,
                error=error,
            )

    def _finish(self, request: EmbedRequest, text: str, error: ErrorInfo | None) -> None:
        try:
            is_recorded = self._record(request, text, error)
        except sqlalchemy.exc.DataError:
            logger.exception("embeddings request %s: its vectors could not be recorded", request.request_id)
            is_recorded = self._record(request, "", RESULT_NOT_RECORDED)
        if not is_recorded:
            logger.warning("request %s already had a result; this run's is dropped", request.request_id)
            return
        logger.info("embeddings request %s finished: %d inputs", request.request_id, len(request.inputs))


def submit_embed(engine: Engine, request: EmbedRequest, on_done: EmbeddingCallback) -> None:
    """`request` into the engine's embedding forwards (a ContinuousEngine's)."""
    embedding = EmbeddingRequest(request.request_id, request.inputs, request.dimensions, request.steering)
    engine.submit_embedding(embedding, on_done)  # type: ignore[attr-defined]


def stored_result(result: EmbeddingResult) -> tuple[str, ErrorInfo | None]:
    """The text a result row or batch line stores for the engine's answer (its vectors), or the error it ended in."""
    if result.error_param is not None:
        return "", ErrorInfo(str(result.error), "invalid_request_error", param=result.error_param)
    if result.error is not None:
        return "", ErrorInfo(result.error, "server_error")
    return encode_vectors(result.vectors.numpy().astype(np.dtype("<f4")).tobytes()), None
