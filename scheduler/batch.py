"""What one engine step computes: a chunk of tokens per scheduled request."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.request import Request


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens [start, start + num_tokens) of the request, whose K/V this step computes."""

    request: Request
    start: int
    num_tokens: int
    is_sampling: bool  # the chunk reaches the request's last token, so the step samples its next token
    num_spec_tokens: int = 0  # proposed tokens at the chunk's end, each verified by the logits before it

    @classmethod
    def of(cls, request: Request, num_tokens: int) -> ScheduledChunk:
        start = request.num_computed_tokens
        is_sampling = start + num_tokens == request.num_tokens + len(request.spec_token_ids)
        num_spec_tokens = len(request.spec_token_ids) if is_sampling else 0
        return cls(request, start, num_tokens, is_sampling, num_spec_tokens)

    @property
    def num_logits(self) -> int:
        """Positions whose logits the step needs: the last one of a sampling chunk, and one per proposed token."""
        return 1 + self.num_spec_tokens if self.is_sampling else 0

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def is_decode(self) -> bool:
        return self.num_tokens == 1 and self.start > 0

    @property
    def token_ids(self) -> list[int]:
        return self.request.token_ids(self.start, self.end)


@dataclass
class Batch:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)  # requests this step pushed back to waiting

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)

    @property
    def sampling_chunks(self) -> list[ScheduledChunk]:
        return [chunk for chunk in self.chunks if chunk.is_sampling]
