"""One generate task in a Celery thread: claim it, run it on the engine (the output processor streams its events),
record the result."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import sqlalchemy.exc

from tasks.messages.generation import (
    ChoiceResult,
    ErrorInfo,
    EventType,
    FinishReason,
    GenerateRequest,
    StreamEvent,
    UsageDetails,
)
from tasks.messages.steering import SteeringSource, SteeringSpec
from tasks.steering_store import profile_keys, steering_of_profiles
from tasks.store.finish import RESULT_NOT_RECORDED
from tasks.store.finish_together import RequestResult
from tasks.store.models import RequestStatus
from tasks.store.request_store import claim_requests
from tasks.streams.cancel_flags import is_cancel_requested
from tasks.streams.redis_keys import RedisKeys
from worker.serving.cancel_watcher import CancelWatcher
from worker.serving.output_processor import FollowedRequest, OutputProcessor
from worker.serving.result_writer import ResultWriter
from worker.serving.task_runner import TaskRunner
from worker.serving.written_together import WrittenTogether
from worker.text.choice import Choice, engine_request_id, start_choice
from worker.text.steering_report import SteeringReport

logger = logging.getLogger(__name__)
# How often a request's thread checks that the engine and the output processor still run (they end its wait at once
# when it finishes). At 0.05 s, 32 waiting threads woke 640 times a second, each taking the GIL from the engine
# thread; at 0.5 s, in three alternated pairs of 32-stream rounds (`--concurrency-levels 32 --rounds 6`, idle
# machine), throughput was higher and first tokens sooner in all three: 2,048/2,110, 1,887/2,741 and 2,152/2,197
# tok/s, TTFT p50 498/483, 495/356 and 453/436 ms. A dead engine fails its requests within half a second.
ENGINE_CHECK_S = 0.5


@dataclass(frozen=True)
class Outcome:
    choices: list[ChoiceResult]
    completion_tokens: int  # over all choices, as OpenAI's usage counts them
    error: ErrorInfo | None = None
    steering: dict[str, Any] | None = None  # the steering that ran, and whether the request or the profile set it
    monitor: dict[str, Any] | None = None  # choice 0's monitored positions
    usage_details: UsageDetails = field(default_factory=UsageDetails)
    is_steered: bool = False  # features or vectors ran (`steering` also reports an explicitly empty spec)

    @classmethod
    def ended(cls, finish_reason: FinishReason | None, error: ErrorInfo | None = None) -> Outcome:
        """An outcome with nothing generated."""
        return cls([ChoiceResult(0, "", finish_reason)], 0, error)


@dataclass(frozen=True)
class Start:
    """How a request's start went: its choices submitted (`followed`), or the error that stopped it, or nothing
    submitted because its client had cancelled it before it started."""

    followed: FollowedRequest | None = None
    error: Exception | None = None
    is_cancelled: bool = False


class GenerationHandler(TaskRunner):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cancels = CancelWatcher(self.redis, self.config)
        self.cancels.start()
        self.outputs = OutputProcessor(self.redis, self.config, self.tokenizer, self.engine, self.metrics)
        self.outputs.start()
        self.results = ResultWriter(self.sessions, self.redis, self.config)
        self.results.start()
        # a burst's claims, each a transaction of its own, took the database's write lock in turn
        self.claims: WrittenTogether[str, RequestStatus | None] = WrittenTogether("claim-writer", self._claim_together)
        self.claims.start()

    def close(self) -> None:
        self.cancels.stop()
        self.outputs.stop()
        self.results.stop()
        self.claims.stop()

    def status_before_claim(self, request_id: str) -> RequestStatus | None:
        """Claimed with every other request whose claim waits, in one transaction."""
        return self.claims.submit(request_id)

    def _claim_together(self, request_ids: list[str]) -> list[RequestStatus | None]:
        with self.sessions() as session:
            return claim_requests(session, request_ids, self.worker)

    def handle(self, request: GenerateRequest) -> None:
        """The engine starts on the request before the claim's SQL round trips, so they overlap its prefill instead of
        preceding it; its outputs wait, unapplied and unwritten, until the claim says the request is this run's (one
        that is not is cancelled in the engine, and nothing of it reaches the stream or the database)."""
        start = self._start(request)
        try:
            if not self.claim(request.request_id):
                return
            try:
                outcome = self._outcome_of(request, start)
            except Exception as exc:
                # Redis or the database failed mid-request: still leave exactly one result, if they let us.
                logger.exception("request %s failed in the worker", request.request_id)
                self.metrics.count_error(exc)
                outcome = Outcome.ended(None, ErrorInfo("The worker failed while generating.", "server_error"))
            self._finish(request, outcome)
        finally:
            if start.followed is not None:
                self._drop(start.followed)

    def _start(self, request: GenerateRequest) -> Start:
        """The request's choices submitted to the engine (those submitted, and the error, if one failed)."""
        followed = None
        try:
            steering, source, is_cancelled = self._read_before_start(request)
            if is_cancelled:
                return Start(is_cancelled=True)
            report = SteeringReport(engine_request_id(request, 0), request.monitor, source)
            followed = FollowedRequest(request, report)
            on_output = partial(self.outputs.put, followed)
            for index in range(request.num_choices):  # one by one, so a failed submit still cancels those before it
                choice = start_choice(self.engine, self.tokenizer, request, index, on_output, steering)
                followed.choices[choice.engine_request_id] = choice
        except Exception as exc:
            return Start(followed, exc)
        return Start(followed)

    def _outcome_of(self, request: GenerateRequest, start: Start) -> Outcome:
        if start.error is not None:
            raise start.error
        if start.is_cancelled:
            return Outcome.ended(FinishReason.ABORT)
        assert start.followed is not None, "_start submits, fails or finds the request cancelled"
        return self._run(start.followed)

    def _run(self, followed: FollowedRequest) -> Outcome:
        request = followed.request

        def on_cancel(_: bool) -> None:
            self._cancel(followed)

        try:
            self.cancels.watch(request.request_id, on_cancel)
            self.outputs.follow(followed, opening=StreamEvent(EventType.START))
            error = self._wait(followed)
        finally:
            self.cancels.forget(request.request_id, on_cancel)
            self._drop(followed)  # from here on the choices are ours alone to read
        outcome = _outcome(list(followed.choices.values()), request.n, error)
        report = followed.report
        return dataclasses.replace(
            outcome, steering=report.steering(), monitor=report.monitor(self.tokenizer), is_steered=report.is_steered
        )

    def _drop(self, followed: FollowedRequest) -> None:
        """No more of its outputs are applied, and its choices end in the engine (a no-op for those that ended)."""
        self.outputs.forget(followed)
        self._cancel(followed)

    def _read_before_start(self, request: GenerateRequest) -> tuple[SteeringSpec | None, SteeringSource, bool]:
        """The steering the request runs with (its own, else its tenant's profile, else the worker-wide one) and
        whether its cancel flag is set, in one round trip before the engine starts on it, so that neither read waits
        in line after the claim. The worker reads the profiles when the request runs rather than the api when it is
        submitted, so a PUT applies at once, to queued requests too, and the api's hot path makes no extra Redis read.
        A flag set after this read is the cancel watcher's, which reads every watched request's flag as it watches."""
        if request.steering is not None:
            is_cancelled = is_cancel_requested(self.redis, self.config, request.request_id)
            return request.steering, SteeringSource.REQUEST, is_cancelled
        cancel_flag = RedisKeys(self.config.redis_prefix).cancel_flag(request.request_id)
        own, worker_wide, flag = self.redis.mget([*profile_keys(self.config, request.tenant), cancel_flag])
        return *steering_of_profiles(own, worker_wide), flag is not None

    def _cancel(self, followed: FollowedRequest) -> None:
        for choice_id in followed.choices:
            self.engine.cancel(choice_id)

    def _wait(self, followed: FollowedRequest) -> ErrorInfo | None:
        """Until the output processor has streamed every choice to its end (a cancel flag reaches the engine
        through the watcher, whose abort outputs end the choices); the error that ended the request, if any."""
        while not followed.done.wait(ENGINE_CHECK_S):
            if not self.engine.is_alive():
                return ErrorInfo("The engine stopped.", "server_error")
            if not self.outputs.is_alive():
                return ErrorInfo("The worker's output processor stopped.", "server_error")
        if followed.failure is not None:
            raise followed.failure
        return followed.error

    def _record(self, request: GenerateRequest, outcome: Outcome) -> bool:
        """The request's one result and its FINAL event, written with those of the requests ending beside it."""
        return self.results.record(
            RequestResult(
                request.request_id,
                request.num_prompt_tokens,
                text=outcome.choices[0].text,
                completion_tokens=outcome.completion_tokens,
                finish_reason=outcome.choices[0].finish_reason,
                error=outcome.error,
                logprobs=outcome.choices[0].logprobs,
                prompt_logprobs=outcome.choices[0].prompt_logprobs,
                extra_choices=[choice.to_dict() for choice in outcome.choices[1:]] or None,
                steering=outcome.steering,
                monitor=outcome.monitor,
                usage_details=outcome.usage_details,
            )
        )

    def _finish(self, request: GenerateRequest, outcome: Outcome) -> None:
        try:
            is_recorded = self._record(request, outcome)
        except sqlalchemy.exc.DataError:
            # a value this database refuses: the request must still end, once, so it ends with an error
            logger.exception("request %s: its result could not be recorded; recording an error", request.request_id)
            outcome = Outcome.ended(None, RESULT_NOT_RECORDED)
            is_recorded = self._record(request, outcome)
        if not is_recorded:
            logger.warning("request %s already had a result; this run's is dropped", request.request_id)
            return
        first = outcome.choices[0]
        self.metrics.observe_e2e(request)
        self.metrics.observe_finished(
            request,
            first.finish_reason,
            outcome.completion_tokens,
            is_error=outcome.error is not None,
            is_steered=outcome.is_steered,
        )
        logger.info(
            "request %s finished: %s, %d tokens",
            request.request_id,
            outcome.choices[0].finish_reason.value
            if outcome.error is None and outcome.choices[0].finish_reason
            else "error",
            outcome.completion_tokens,
        )


def _outcome(choices: list[Choice], n: int, error: ErrorInfo | None = None) -> Outcome:
    num_accepted = sum(choice.num_accepted_tokens for choice in choices)
    details = UsageDetails(
        # each prompt counts once in usage, so its cached part does too: its first choice's
        cached_tokens=sum(choice.num_cached_tokens for choice in choices if choice.index % n == 0),
        accepted_prediction_tokens=num_accepted,
        rejected_prediction_tokens=sum(choice.num_proposed_tokens for choice in choices) - num_accepted,
    )
    num_tokens = sum(choice.num_tokens for choice in choices)
    return Outcome([choice.result() for choice in choices], num_tokens, error, usage_details=details)
