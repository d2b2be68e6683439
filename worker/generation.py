"""One generate task in a Celery thread: claim it, run it on the engine, stream events, record the result."""

from __future__ import annotations

import dataclasses
import logging
import queue
import time
from dataclasses import dataclass, field
from typing import Any

from tasks.finish import finish_request
from tasks.messages import ChoiceResult, ErrorInfo, EventType, FinishReason, GenerateRequest, StreamEvent, UsageDetails
from tasks.models import TERMINAL_STATUSES, RequestStatus
from tasks.steering_messages import SteeringSpec
from tasks.steering_store import read_profile
from tasks.store import claim_request
from tasks.streams import append_event, is_cancel_requested
from worker.cancel_watcher import CancelWatcher
from worker.choice import Choice, ChoiceDelta, start_choice
from worker.engine import EngineOutput
from worker.steering_report import PROFILE, REQUEST, SteeringReport
from worker.task_runner import TaskRunner

logger = logging.getLogger(__name__)
ENGINE_CHECK_S = 0.05  # how often a request's thread checks that the engine still runs


@dataclass(frozen=True)
class Outcome:
    choices: list[ChoiceResult]
    completion_tokens: int  # over all choices, as OpenAI's usage counts them
    error: ErrorInfo | None = None
    steering: dict[str, Any] | None = None  # the steering that ran, and whether the request or the profile set it
    monitor: dict[str, Any] | None = None  # choice 0's monitored positions
    usage_details: UsageDetails = field(default_factory=UsageDetails)

    @classmethod
    def ended(cls, finish_reason: FinishReason | None, error: ErrorInfo | None = None) -> Outcome:
        """An outcome with nothing generated."""
        return cls([ChoiceResult(0, "", finish_reason)], 0, error)


class GenerationHandler(TaskRunner):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cancels = CancelWatcher(self.redis, self.config)
        self.cancels.start()

    def close(self) -> None:
        self.cancels.stop()

    def handle(self, request: GenerateRequest) -> None:
        if not self._claim(request):
            return
        try:
            if is_cancel_requested(self.redis, self.config, request.request_id):
                outcome = Outcome.ended(FinishReason.ABORT)
            else:
                self._emit(request.request_id, StreamEvent(EventType.START))
                outcome = self._run(request)
        except Exception:
            # Redis or the database failed mid-request: still leave exactly one result, if they let us.
            logger.exception("request %s failed in the worker", request.request_id)
            outcome = Outcome.ended(None, ErrorInfo("The worker failed while generating.", "server_error"))
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
            self._finish(request, Outcome.ended(None, error))
            return False
        return True

    def _run(self, request: GenerateRequest) -> Outcome:
        outputs: queue.Queue[EngineOutput] = queue.Queue()
        steering, source = self._steering_for(request)
        choices: list[Choice] = []

        def on_cancel(_: bool) -> None:
            self._cancel(choices)

        try:
            for index in range(request.n):  # started one by one, so a failed submit still cancels those before it
                choices.append(start_choice(self.engine, self.tokenizer, request, index, outputs.put, steering))
            report = SteeringReport(choices[0].engine_request_id, request.monitor, source)
            self.cancels.watch(request.request_id, on_cancel)
            outcome = self._follow(request, choices, outputs, report)
        finally:
            self.cancels.forget(request.request_id, on_cancel)
            self._cancel(choices)  # a no-op for choices the engine has finished
        return dataclasses.replace(outcome, steering=report.steering(), monitor=report.monitor(self.tokenizer))

    def _steering_for(self, request: GenerateRequest) -> tuple[SteeringSpec | None, str]:
        """The request's own steering, else the worker-wide profile (read per request, so a PUT applies at once)."""
        if request.steering is not None:
            return request.steering, REQUEST
        return read_profile(self.redis, self.config), PROFILE

    def _cancel(self, choices: list[Choice]) -> None:
        for choice in choices:
            self.engine.cancel(choice.engine_request_id)

    def _follow(
        self,
        request: GenerateRequest,
        choices: list[Choice],
        outputs: queue.Queue[EngineOutput],
        report: SteeringReport,
    ) -> Outcome:
        """Streams the choices' outputs until all are done; a cancel flag reaches the engine through the watcher,
        whose abort outputs end the choices here."""
        by_engine_id = {choice.engine_request_id: choice for choice in choices}
        next_engine_check = 0.0
        while not all(choice.is_done for choice in choices):
            if time.monotonic() >= next_engine_check:
                next_engine_check = time.monotonic() + ENGINE_CHECK_S
                if not self.engine.is_alive():
                    return _outcome(choices, ErrorInfo("The engine stopped.", "server_error"))
            try:
                output = outputs.get(timeout=ENGINE_CHECK_S)
            except queue.Empty:
                continue
            choice = by_engine_id[output.request_id]
            if choice.is_done:
                continue  # the abort that follows a stop string
            report.add(output)
            delta = choice.apply(output, self.tokenizer)
            if choice.error is not None:
                return _outcome(choices, ErrorInfo(choice.error, choice.error_type))
            self._emit_delta(request, choice.index, delta)
            if choice.is_done and output.finish_reason is None:
                self.engine.cancel(choice.engine_request_id)  # a stop string ended it before the engine did
        return _outcome(choices)

    def _emit_delta(self, request: GenerateRequest, index: int, delta: ChoiceDelta) -> None:
        """Choice 0's finish reason rides on the FINAL event; the others end with their last DELTA."""
        finish_reason = delta.finish_reason if index > 0 else None
        if delta.text or delta.token_ids or finish_reason is not None:
            event = StreamEvent(
                EventType.DELTA,
                text=delta.text,
                token_ids=delta.token_ids,
                logprobs=delta.logprobs,
                index=index,
                finish_reason=finish_reason,
            )
            self._emit(request.request_id, event)

    def _emit(self, request_id: str, event: StreamEvent) -> None:
        append_event(self.redis, self.config, request_id, event)

    def _finish(self, request: GenerateRequest, outcome: Outcome) -> None:
        with self.sessions() as session:
            is_recorded = finish_request(
                session,
                self.redis,
                self.config,
                request.request_id,
                text=outcome.choices[0].text,
                completion_tokens=outcome.completion_tokens,
                finish_reason=outcome.choices[0].finish_reason,
                error=outcome.error,
                logprobs=outcome.choices[0].logprobs,
                extra_choices=[choice.to_dict() for choice in outcome.choices[1:]] or None,
                steering=outcome.steering,
                monitor=outcome.monitor,
                usage_details=outcome.usage_details,
            )
        if not is_recorded:
            logger.warning("request %s already had a result; this run's is dropped", request.request_id)
            return
        logger.info(
            "request %s finished: %s, %d tokens",
            request.request_id,
            outcome.choices[0].finish_reason.value
            if outcome.error is None and outcome.choices[0].finish_reason
            else "error",
            outcome.completion_tokens,
        )


def _outcome(choices: list[Choice], error: ErrorInfo | None = None) -> Outcome:
    num_accepted = sum(choice.num_accepted_tokens for choice in choices)
    details = UsageDetails(
        cached_tokens=choices[0].num_cached_tokens,  # the prompt counts once in usage, so its cached part does too
        accepted_prediction_tokens=num_accepted,
        rejected_prediction_tokens=sum(choice.num_proposed_tokens for choice in choices) - num_accepted,
    )
    num_tokens = sum(choice.num_tokens for choice in choices)
    return Outcome([choice.result() for choice in choices], num_tokens, error, usage_details=details)
