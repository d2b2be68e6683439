"""Where the engine thread leaves a batch chunk's outputs, and the stop watcher its batch's stop, for the chunk's own
thread.

That thread shares the GIL with the engine thread, so it wakes only for what it must act on at once: a stop, a
line's last output, and every output of a line with stop strings (whose text is checked as it grows). The outputs of
the other lines wait, and a request's waiting outputs are joined into one: one detokenizer push and one wake-up per
line instead of one per engine step, which took the engine thread's GIL every step."""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from dataclasses import dataclass, field

from tasks.batches.models import LineStatus
from worker.engine.interface import EngineOutput


@dataclass(eq=False)
class ChunkInbox:
    joinable: deque[EngineOutput] = field(default_factory=deque)
    urgent: deque[EngineOutput] = field(default_factory=deque)
    has_news: threading.Event = field(default_factory=threading.Event)
    stopped_as: LineStatus | None = None  # the batch is being cancelled or expired: its running lines end so

    def stop(self, status: LineStatus) -> None:
        self.stopped_as = status
        self.has_news.set()

    def put(self, output: EngineOutput) -> None:
        self.joinable.append(output)
        if output.is_finished:
            self.has_news.set()

    def put_urgent(self, output: EngineOutput) -> None:
        self.urgent.append(output)
        self.has_news.set()

    def take_news(self, timeout_s: float) -> list[EngineOutput]:
        """Everything put so far, each joinable request's outputs joined, once there is news; none if `timeout_s`
        passes first."""
        if not self.has_news.wait(timeout_s):
            return []
        self.has_news.clear()
        by_request: dict[str, list[EngineOutput]] = {}
        for _ in range(len(self.joinable)):
            output = self.joinable.popleft()
            by_request.setdefault(output.request_id, []).append(output)
        urgent = [self.urgent.popleft() for _ in range(len(self.urgent))]
        return [joined_output(outputs) for outputs in by_request.values()] + urgent


def joined_output(outputs: list[EngineOutput]) -> EngineOutput:
    """One request's consecutive outputs as the single output they add up to; only the last may be finished."""
    if len(outputs) == 1:
        return outputs[0]
    steerings = [output.steering for output in outputs if output.steering is not None]
    return dataclasses.replace(
        outputs[-1],
        new_token_ids=[token_id for output in outputs for token_id in output.new_token_ids],
        logprobs=tuple(logprob for output in outputs for logprob in output.logprobs),
        # cumulative counts, which an abort's output does not carry
        num_cached_tokens=max(output.num_cached_tokens for output in outputs),
        num_proposed_tokens=max(output.num_proposed_tokens for output in outputs),
        num_accepted_tokens=max(output.num_accepted_tokens for output in outputs),
        steering=steerings[-1] if steerings else None,
        monitor=tuple(position for output in outputs for position in output.monitor),
    )
