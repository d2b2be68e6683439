"""Prompt logprobs from the forward pass that prefills the prompt, never a second one.

A row that asks for them has the logits of its chunk's prompt positions kept besides the step's sampling logits
(position p's logits score prompt token p + 1; the last prompt position's score the first output, which is sampled
as usual), over however many chunks its prefill takes. The step takes their log_softmax on the device, and the
values wait in the request's sequence to ride out with its next output. A row that asks for none adds nothing.

A preempted request recomputes its prompt: positions it already scored are not kept again, so each prompt token is
reported once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from scheduler.batch import ScheduledChunk
from tasks.messages.generation import TokenLogprob
from worker.engine.transfers import to_device, to_host

if TYPE_CHECKING:
    from worker.engine.sequence import EngineSequence


@dataclass(frozen=True)
class PromptSpan:
    """Prompt tokens [first_token, first_token + num_tokens) of one request, scored this step."""

    request_id: str
    first_token: int
    num_tokens: int
    num_top: int  # alternatives reported per position


@dataclass(frozen=True)
class PromptLogitRows:
    spans: list[PromptSpan]
    indices: list[int]  # the packed token index of every kept position, span after span


def prompt_logit_rows(chunks: list[ScheduledChunk], sequences: Mapping[str, EngineSequence]) -> PromptLogitRows:
    """The prompt positions of this step's chunks whose logits must be kept."""
    spans: list[PromptSpan] = []
    indices: list[int] = []
    offset = 0  # where the chunk's first token lies in the packed step
    for chunk in chunks:
        sequence = sequences[chunk.request.request_id]
        num_top = sequence.request.sampling.prompt_logprobs
        if num_top is not None:
            first = max(chunk.start, sequence.num_prompt_logprobs - 1)
            stop = min(chunk.end, chunk.request.num_prompt_tokens - 1)
            if first < stop:
                spans.append(PromptSpan(chunk.request.request_id, first + 1, stop - first, num_top))
                indices.extend(range(offset + first - chunk.start, offset + stop - chunk.start))
        offset += chunk.num_tokens
    return PromptLogitRows(spans, indices)


@dataclass(frozen=True)
class PromptScores:
    """A step's prompt logprobs on the device, until `collect` reads them back."""

    spans: list[PromptSpan]
    chosen: torch.Tensor  # [P] the prompt token's logprob at each kept position
    ranks: torch.Tensor  # [P] its rank: 1 + the tokens more likely
    top_values: torch.Tensor  # [P, K] the K most likely tokens' logprobs (K: the most any span asks for)
    top_ids: torch.Tensor  # [P, K]

    def collect(self, sequences: Mapping[str, EngineSequence]) -> None:
        """Appends each span's entries to its request's sequence; call after the step's wait for the device."""
        host = to_host(self.chosen, self.ranks, self.top_values, self.top_ids)  # by now the device is done
        chosen, ranks, top_values, top_ids = (tensor.tolist() for tensor in host)
        row = 0
        for span in self.spans:
            sequence = sequences[span.request_id]
            prompt = sequence.scheduled.prompt_token_ids
            for position in range(span.num_tokens):
                top = tuple(zip(top_ids[row][: span.num_top], top_values[row][: span.num_top], strict=True))
                entry = TokenLogprob(prompt[span.first_token + position], chosen[row], top, ranks[row])
                sequence.pending_prompt_logprobs.append(entry)
                row += 1
            sequence.num_prompt_logprobs += span.num_tokens


def score_prompts(
    logits: torch.Tensor | None, rows: PromptLogitRows, sequences: Mapping[str, EngineSequence]
) -> PromptScores | None:
    """`logits` [P, V] float at `rows.indices`; None when the step kept none."""
    if logits is None or not rows.spans:
        return None
    targets = [
        token_id
        for span in rows.spans
        for token_id in sequences[span.request_id].scheduled.prompt_token_ids[
            span.first_token : span.first_token + span.num_tokens
        ]
    ]
    logprobs = torch.log_softmax(logits, dim=-1)  # [P, V]
    chosen = logprobs.gather(1, to_device(targets, torch.long, logits.device)[:, None])[:, 0]  # [P]
    ranks = (logprobs > chosen[:, None]).sum(dim=-1) + 1  # [P]
    top_values, top_ids = logprobs.topk(max(span.num_top for span in rows.spans), dim=-1)  # [P, K]
    return PromptScores(rows.spans, chosen, ranks, top_values, top_ids)
