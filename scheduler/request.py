"""A request as the scheduler sees it: token ids, progress through them, its KV blocks, and its status."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter


class RequestStatus(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # its blocks were taken back; it waits to recompute from token 0
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"


FINISHED_STATUSES = frozenset(
    {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}
)
# The same strings as tasks.messages.generation.FinishReason, which the scheduler does not import (stdlib only).
FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    stop_token_ids: frozenset[int] = frozenset()  # EOS included unless the request ignores it
    min_tokens: int = 0  # stop tokens do not end the request before this many outputs
    priority: int = 0  # lower runs first
    steering_key: str = ""  # digest of the applied steering ("" unsteered): prefix-cache block hashes must include it
    may_reuse_cached_prefix: bool = True  # False when a monitor must read the prompt's positions: they must be computed
    arrival_index: int = 0  # FIFO order among equal priorities; the scheduler sets it
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the blocks
    block_table: list[int] = field(default_factory=list)
    num_released_blocks: int = 0  # leading blocks handed back once out of every layer's window; their entries read 0
    block_hashes: list[bytes] = field(default_factory=list)  # of the full blocks cached so far, in order
    num_cached_tokens: int = -1  # prompt tokens the prefix cache served at first admission; -1 before it
    spec_token_ids: list[int] = field(default_factory=list)  # proposed to follow the output, verified next step
    status: RequestStatus = RequestStatus.WAITING

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens the next chunks must compute: the rest of prompt + output, then any proposed tokens."""
        return self.num_tokens + len(self.spec_token_ids) - self.num_computed_tokens

    def token_ids(self, start: int, stop: int) -> list[int]:
        """Tokens [start, stop) of prompt + output + proposed tokens."""
        num_prompt = self.num_prompt_tokens
        if stop <= num_prompt:
            return self.prompt_token_ids[start:stop]
        return (self.prompt_token_ids + self.output_token_ids + self.spec_token_ids)[start:stop]

    def token_at(self, position: int) -> int:
        """Token `position` of prompt + output + proposed tokens, without joining them."""
        for part in (self.prompt_token_ids, self.output_token_ids, self.spec_token_ids):
            if position < len(part):
                return part[position]
            position -= len(part)
        raise IndexError(f"request {self.request_id!r} has no token at that position")

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)


# The scheduler's order: priority (lower first), then arrival. An attrgetter, as sorting calls it per request.
SCHEDULING_ORDER = attrgetter("priority", "arrival_index")
