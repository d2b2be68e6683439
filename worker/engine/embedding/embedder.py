"""The engine thread's embedding forwards: every input of the jobs taken together, packed into forwards of at most
a token budget each, run through the model's decoder (no LM head, no KV pool), pooled and normalised per input."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from steering.step_plan import StepPlan
from worker.engine.embedding.jobs import EmbeddingJob, EmbeddingResult
from worker.engine.embedding.packed_attention import PackedInputs
from worker.engine.embedding.pooling import Pooling, normalized, pool, read_pooling
from worker.engine.model_runner import ModelRunner
from worker.engine.transfers import to_device, to_host
from worker.steering.steering_plan import steering_tables

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Piece:
    """One input of one job."""

    job: EmbeddingJob
    index: int

    @property
    def token_ids(self) -> list[int]:
        return self.job.request.inputs[self.index]


def token_groups(pieces: list[Piece], max_tokens: int) -> Iterator[list[Piece]]:
    """`pieces` in order, cut into runs of at most `max_tokens` tokens (an input longer than that runs alone)."""
    group: list[Piece] = []
    num_tokens = 0
    for piece in pieces:
        if group and num_tokens + len(piece.token_ids) > max_tokens:
            yield group
            group, num_tokens = [], 0
        group.append(piece)
        num_tokens += len(piece.token_ids)
    if group:
        yield group


class Embedder:
    """Engine thread only."""

    def __init__(self, runner: ModelRunner, max_tokens_per_forward: int, model_dir: str) -> None:
        self._runner = runner
        self._max_tokens = max_tokens_per_forward
        self._pooling: Pooling | None = None
        self._pooling_error: str | None = None
        try:
            self._pooling = read_pooling(model_dir)
        except (ValueError, OSError) as exc:  # the model still generates; its embeddings are refused, saying why
            self._pooling_error = f"this model's embeddings cannot be computed: {exc}"

    def run(self, jobs: list[EmbeddingJob]) -> None:
        """Answers every job, with its vectors or its error."""
        if self._pooling is None:
            for job in jobs:
                _deliver(job, EmbeddingResult(job.request.request_id, None, self._pooling_error, "model"))
            return
        pooled: dict[int, list[torch.Tensor]] = {id(job): [] for job in jobs}
        failed: dict[int, str] = {}
        pieces = [Piece(job, index) for job in jobs for index in range(len(job.request.inputs))]
        for group in token_groups(pieces, self._max_tokens):
            try:
                vectors = self._forward(group, self._pooling)  # [G, D]
            except Exception as exc:
                logger.exception("an embedding forward over %d inputs failed", len(group))
                failed.update((id(piece.job), f"the embedding forward failed: {exc}") for piece in group)
                continue
            for piece, vector in zip(group, vectors, strict=True):
                pooled[id(piece.job)].append(vector)
        done = [job for job in jobs if id(job) not in failed]
        results = [normalized(torch.stack(pooled[id(job)]), job.request.dimensions) for job in done]
        for job, vectors in zip(done, to_host(*results), strict=True):
            _deliver(job, EmbeddingResult(job.request.request_id, vectors))
        for job in jobs:
            if id(job) in failed:
                _deliver(job, EmbeddingResult(job.request.request_id, None, failed[id(job)]))

    def _forward(self, group: list[Piece], pooling: Pooling) -> torch.Tensor:
        """[G, D] float32: each input's pooled last hidden state, with its job's steering."""
        runner, device = self._runner, self._runner.device
        lengths = [len(piece.token_ids) for piece in group]
        input_ids = to_device([token for piece in group for token in piece.token_ids], torch.int64, device)
        positions = to_device([position for length in lengths for position in range(length)], torch.int64, device)
        rows = torch.arange(len(group), device=device)
        token_rows = torch.repeat_interleave(rows, to_device(lengths, torch.int64, device))  # [N]
        steering = steering_tables(token_rows, [piece.job.sae for piece in group], runner.dtype)
        if steering:
            runner.hooks.set_step(StepPlan(steering=steering))
        try:
            output = runner.model.base_model(
                input_ids=input_ids[None],
                position_ids=positions[None],
                use_cache=False,
                packed_inputs=PackedInputs(tuple(lengths)),
            )
        finally:
            runner.hooks.clear()
        return pool(output.last_hidden_state[0], lengths, pooling)


def _deliver(job: EmbeddingJob, result: EmbeddingResult) -> None:
    try:
        job.on_done(result)
    except Exception:
        logger.exception("the embedding callback of request %s raised", job.request.request_id)
