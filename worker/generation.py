"""One generate task in a Celery thread: claim it, run it on the engine, stream events, record the result."""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass
from typing import Any

import redis
from transformers import PreTrainedTokenizerFast

from tasks.config import Config
from tasks.db import SessionFactory
from tasks.finish import finish_request
from tasks.messages import ErrorInfo, EventType, FinishReason, GenerateRequest, StreamEvent
from tasks.models import TERMINAL_STATUSES, RequestStatus
from tasks.store import claim_request
from tasks.streams import append_event, is_cancel_requested
from worker.engine import Engine, EngineOutput, EngineRequest
from worker.logprob_entries import logprob_entries
from worker.text_stream import TextStream

logger = logging.getLogger(__name__)
CANCEL_POLL_S = 0.05


@dataclass(frozen=True)
class Outcome:
    text: str
    completion_tokens: int
    finish_reason: FinishReason | None
    error: ErrorInfo | None = None
    logprobs: list[dict[str, Any]] | None = None  # None unless the request asked for logprobs


class GenerationHandler:
    def __init__(
        self,
        config: Config,
        engine: Engine,
        tokenizer: PreTrainedTokenizerFast,
        client: redis.Redis,
        sessions: SessionFactory,
        worker: str,
    ) -> None:
        self.worker = worker
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.redis = client
        self.sessions = sessions

    def handle(self, request: GenerateRequest) -> None:
        if not self._claim(request):
            return
        try:
            if is_cancel_requested(self.redis, self.config, request.request_id):
                outcome = Outcome("", 0, FinishReason.ABORT)
            else:
                self._emit(request.request_id, StreamEvent(EventType.START))
                outcome = self._run(request)
        except Exception:
            # Redis or the database failed mid-request: still leave exactly one result, if they let us.
            logger.exception("request %s failed in the worker", request.request_id)
            outcome = Outcome("", 0, None, ErrorInfo("The worker failed while generating.", "server_error"))
        self._finish(request, outcome)

    def _claim(self, request: GenerateRequest) -> bool:
        """False when there is nothing to run: unknown, already finished, or redelivered after a worker died."""
        with self.sessions() as session:
            previous = claim_request(session, request.request_id, self.worker)
        if previous is None:
            logger.warning("request %s is not in the database; dropping it", request.request_id)
            return False
        if previous in TERMINAL_STATUSES:
            logger.info("request %s already finished; skipping the redelivery", request.request_id)
            return False
        if previous == RequestStatus.RUNNING:
            # A worker took it and died: rerunning could repeat text a client has already seen.
            error = ErrorInfo("The worker running this request stopped mid-generation.", "server_error")
            self._finish(request, Outcome("", 0, None, error))
            return False
        return True

    def _run(self, request: GenerateRequest) -> Outcome:
        outputs: queue.Queue[EngineOutput] = queue.Queue()
        engine_request = EngineRequest(request.request_id, request.prompt_token_ids, request.sampling)
        self.engine.submit(engine_request, outputs.put)
        try:
            return self._follow(request, outputs)
        finally:
            self.engine.cancel(request.request_id)  # a no-op once the engine has finished the request

    def _follow(self, request: GenerateRequest, outputs: queue.Queue[EngineOutput]) -> Outcome:
        text_stream = TextStream(self.tokenizer, request.prompt_token_ids, request.sampling.stop)
        num_tokens = 0
        logprobs: list[dict[str, Any]] | None = None if request.sampling.logprobs is None else []
        next_cancel_check = 0.0
        while True:
            if time.monotonic() >= next_cancel_check:
                next_cancel_check = time.monotonic() + CANCEL_POLL_S
                if not self.engine.is_alive():
                    return Outcome(text_stream.text, num_tokens, None, ErrorInfo("The engine stopped.", "server_error"))
                if is_cancel_requested(self.redis, self.config, request.request_id):
                    self.engine.cancel(request.request_id)
            try:
                output = outputs.get(timeout=CANCEL_POLL_S)
            except queue.Empty:
                continue
            if output.error is not None:
                return Outcome(text_stream.text, num_tokens, None, ErrorInfo(output.error, "server_error"))
            num_tokens += len(output.new_token_ids)
            entries = logprob_entries(self.tokenizer, output.logprobs)
            if logprobs is not None:
                logprobs.extend(entries)
            text = text_stream.push(output.new_token_ids)
            self._emit_text(request.request_id, text, output.new_token_ids, entries)
            if text_stream.is_stopped:
                return Outcome(text_stream.text, num_tokens, FinishReason.STOP, logprobs=logprobs)
            if output.finish_reason is not None:
                self._emit_text(request.request_id, text_stream.flush(), [])
                return Outcome(text_stream.text, num_tokens, output.finish_reason, logprobs=logprobs)

    def _emit_text(
        self, request_id: str, text: str, token_ids: list[int], logprobs: list[dict[str, Any]] | None = None
    ) -> None:
        if text or token_ids:
            event = StreamEvent(EventType.DELTA, text=text, token_ids=token_ids, logprobs=logprobs or [])
            self._emit(request_id, event)

    def _emit(self, request_id: str, event: StreamEvent) -> None:
        append_event(self.redis, self.config, request_id, event)

    def _finish(self, request: GenerateRequest, outcome: Outcome) -> None:
        with self.sessions() as session:
            is_recorded = finish_request(
                session,
                self.redis,
                self.config,
                request.request_id,
                text=outcome.text,
                completion_tokens=outcome.completion_tokens,
                finish_reason=outcome.finish_reason,
                error=outcome.error,
                logprobs=outcome.logprobs,
            )
        if not is_recorded:
            logger.warning("request %s already had a result; this run's is dropped", request.request_id)
            return
        logger.info(
            "request %s finished: %s, %d tokens",
            request.request_id,
            outcome.finish_reason.value if outcome.finish_reason else "error",
            outcome.completion_tokens,
        )
