"""One chunk task of a batch in a Celery thread: claim its lines, submit them all to the engine at once (so they
fill the continuous batch next to chat), record each line's one result as it finishes, renew the lease meanwhile."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from transformers import PreTrainedTokenizerFast

from tasks.batches.events import publish_lines
from tasks.batches.line_outcomes import LineOutcome, finish_lines
from tasks.batches.messages import ChunkTask
from tasks.batches.models import BatchLine, BatchRecord, LineStatus
from tasks.batches.store import claim_chunk, renew_lease, stop_status
from tasks.config import Config
from tasks.messages.embeddings import is_embed_request
from tasks.messages.generation import FinishReason, GenerateRequest
from tasks.messages.steering import SteeringSource, SteeringSpec
from tasks.steering_store import default_steering
from tasks.store.db import SessionFactory
from worker.engine.interface import BULK_PRIORITY, Engine, EngineOutput
from worker.serving.batch_inbox import ChunkInbox
from worker.serving.batch_stops import StopWatcher
from worker.serving.embeddings.batch_lines import embed_lines
from worker.serving.metrics import ServingMetrics
from worker.serving.task_runner import TaskRunner
from worker.text.choice import Choice, start_choice
from worker.text.steering_report import SteeringReport

logger = logging.getLogger(__name__)
RENEWALS_PER_LEASE = 3


@dataclass
class _LineRun:
    line: BatchLine
    request: GenerateRequest
    choices: dict[str, Choice]  # by engine request id; the same text, stop-string and finish handling as chat's
    report: SteeringReport  # the steering that ran and the positions monitored, as a request's result has them

    def outcome(
        self, output: EngineOutput, stopped_as: LineStatus | None, tokenizer: PreTrainedTokenizerFast
    ) -> LineOutcome | None:
        """The line's result once `output` ends it (an error, an abort, or its last choice), else None."""
        choice = self.choices[output.request_id]
        self.report.add(output)
        choice.apply(output, tokenizer)
        choices = sorted(self.choices.values(), key=lambda c: c.index)
        num_tokens = sum(c.num_tokens for c in choices)
        text = choices[0].result().text
        if choice.error is not None:
            error = {"message": choice.error, "type": choice.error_type, "param": choice.error_param, "code": None}
            return LineOutcome(LineStatus.FAILED, text, None, num_tokens, error)
        if choice.finish_reason == FinishReason.ABORT:
            return LineOutcome(stopped_as or LineStatus.CANCELLED, text, None, num_tokens)
        if not all(c.is_done for c in choices):
            return None
        first = choices[0].result()
        return LineOutcome(
            LineStatus.COMPLETED,
            text,
            first.finish_reason.value if first.finish_reason else None,
            num_tokens,
            logprobs=first.logprobs,
            prompt_logprobs=first.prompt_logprobs,
            steering=self.report.steering(),
            monitor=self.report.monitor(tokenizer),
            extra_choices=[c.result().to_dict() for c in choices[1:]] or None,
        )


@dataclass
class _Chunk:
    task: ChunkTask
    owner: str  # this run's lease owner: the worker's name and a token, unique per delivery
    runs: dict[str, _LineRun]  # by engine request id: a line of n choices is here n times
    inbox: ChunkInbox = field(default_factory=ChunkInbox)
    stopped_as: LineStatus | None = None


class ChunkRunner(TaskRunner):
    def __init__(
        self,
        config: Config,
        engine: Engine,
        tokenizer: PreTrainedTokenizerFast,
        client: redis.Redis,
        sessions: SessionFactory,
        worker: str,
        metrics: ServingMetrics,
        stops: StopWatcher,
        after_chunk: Callable[[str], None],
    ) -> None:
        super().__init__(config, engine, tokenizer, client, sessions, worker, metrics)
        self._stops = stops
        self._after_chunk = after_chunk  # closes the batch if this was its last line, and dispatches more

    def run(self, task: ChunkTask) -> None:
        owner = f"{self.worker}#{uuid.uuid4().hex[:8]}"
        with self.sessions() as session:
            lines = claim_chunk(session, task, owner, self.config.batch_line_lease_s)
        if not lines:
            logger.info("chunk %s has nothing left to run; skipping the redelivery", task.chunk_id)
            return
        if is_embed_request(lines[0].request or {}):  # a batch's lines all go to its one endpoint
            embed_lines(self, task.batch_id, owner, lines)
        else:
            self._generate(task, owner, lines)
        self._after_chunk(task.batch_id)

    def _generate(self, task: ChunkTask, owner: str, lines: list[BatchLine]) -> None:
        chunk = _Chunk(task, owner, {})
        self._stops.watch(task.batch_id, chunk.inbox.stop)
        try:
            self._submit_all(chunk, lines)
            self._follow(chunk)
        finally:
            self._stops.forget(task.batch_id, chunk.inbox.stop)
            for request_id in chunk.runs:
                self.engine.cancel(request_id)

    def _submit_all(self, chunk: _Chunk, lines: list[BatchLine]) -> None:
        """Every choice of every line into the engine at once, at bulk priority."""
        defaults: dict[str, tuple[SteeringSpec | None, SteeringSource]] = {}  # read once per tenant and chunk
        for line in lines:
            request = GenerateRequest.from_dict(line.request or {})
            if request.steering is not None:
                steering, source = request.steering, SteeringSource.REQUEST
            else:
                if request.tenant not in defaults:
                    defaults[request.tenant] = default_steering(self.redis, self.config, request.tenant)
                steering, source = defaults[request.tenant]
            on_output = chunk.inbox.put_urgent if request.sampling.stop else chunk.inbox.put
            choices = [
                start_choice(self.engine, self.tokenizer, request, index, on_output, steering, BULK_PRIORITY)
                for index in range(request.num_choices)
            ]
            report = SteeringReport(choices[0].engine_request_id, request.monitor, source)
            run = _LineRun(line, request, {choice.engine_request_id: choice for choice in choices}, report)
            chunk.runs.update({engine_request_id: run for engine_request_id in run.choices})
        task = chunk.task
        logger.info("chunk %s of %s: %d lines in the engine", task.chunk_id, task.batch_id, len(lines))

    def _follow(self, chunk: _Chunk) -> None:
        renew_every_s = self.config.batch_line_lease_s / RENEWALS_PER_LEASE
        next_renewal = time.monotonic() + renew_every_s  # the claim has just leased the lines
        while chunk.runs:
            # lines that finish together are recorded in one transaction
            outputs = chunk.inbox.take_news(timeout_s=max(0.0, next_renewal - time.monotonic()))
            if not self.engine.is_alive():
                logger.error("the engine stopped; chunk %s will lapse and run again", chunk.task.chunk_id)
                return
            self._check_stop(chunk, chunk.inbox.stopped_as)
            if time.monotonic() >= next_renewal:
                next_renewal = time.monotonic() + renew_every_s
                self._renew(chunk)
            self._record(chunk, [finished for output in outputs if (finished := self._take(chunk, output))])

    def _take(self, chunk: _Chunk, output: EngineOutput) -> tuple[_LineRun, LineOutcome] | None:
        """The line and its result if `output` ended it."""
        run = chunk.runs.get(output.request_id)
        if run is None or run.choices[output.request_id].is_done:
            return None  # the abort that follows a cancel, or a line already recorded
        outcome = run.outcome(output, chunk.stopped_as, self.tokenizer)
        if run.choices[output.request_id].is_done and not output.is_finished:
            self.engine.cancel(output.request_id)  # a stop string ended it before the engine knew
        if outcome is None:
            return None
        for engine_request_id in run.choices:  # the line is over: its other choices stop too
            chunk.runs.pop(engine_request_id, None)
            self.engine.cancel(engine_request_id)
        return run, outcome

    def _record(self, chunk: _Chunk, finished: list[tuple[_LineRun, LineOutcome]]) -> None:
        if not finished:
            return
        lines = {run.line.id: run.line for run, _ in finished}
        with self.sessions() as session:

            def publish(recorded: dict[int, LineStatus]) -> None:
                events = [(lines[line_id], status) for line_id, status in recorded.items()]
                publish_lines(self.redis, self.config, session, chunk.task.batch_id, events)

            recorded = finish_lines(session, chunk.owner, {run.line.id: outcome for run, outcome in finished}, publish)
        for run, outcome in finished:
            if run.line.id in recorded:
                self._count(run, outcome)
            else:
                logger.warning(
                    "line %d of %s was taken from this worker; its result is dropped",
                    run.line.line_no,
                    chunk.task.batch_id,
                )

    def _count(self, run: _LineRun, outcome: LineOutcome) -> None:
        self.metrics.count_line(outcome.status)
        if outcome.status in (LineStatus.CANCELLED, LineStatus.EXPIRED):
            finish_reason: FinishReason | None = FinishReason.ABORT
        else:
            finish_reason = FinishReason(outcome.finish_reason) if outcome.finish_reason else None
        is_error, is_steered = outcome.status == LineStatus.FAILED, run.report.is_steered
        self.metrics.observe_finished(
            run.request, finish_reason, outcome.completion_tokens, is_error=is_error, is_steered=is_steered
        )

    def _check_stop(self, chunk: _Chunk, stopped_as: LineStatus | None) -> None:
        if stopped_as is not None and chunk.stopped_as is None:
            logger.info(
                "batch %s is stopping (%s); aborting chunk %s",
                chunk.task.batch_id,
                stopped_as.value,
                chunk.task.chunk_id,
            )
            chunk.stopped_as = stopped_as
            for request_id in chunk.runs:
                self.engine.cancel(request_id)

    def _renew(self, chunk: _Chunk) -> None:
        """Extend the lease; lines a reaper took from this worker stop here, and a stop missed in Redis is seen."""
        with self.sessions() as session:
            held = renew_lease(session, chunk.task.chunk_id, chunk.owner, self.config.batch_line_lease_s)
            batch = session.get(BatchRecord, chunk.task.batch_id)
            self._check_stop(chunk, stop_status(batch) if batch is not None else LineStatus.CANCELLED)
        for request_id, run in list(chunk.runs.items()):
            if run.line.id not in held:
                del chunk.runs[request_id]
                self.engine.cancel(request_id)
