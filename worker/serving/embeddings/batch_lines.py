"""A chunk of an embeddings batch: every line's inputs into the engine at once (its embedding forwards batch them
with each other and with any interactive embeddings waiting), then every line's one result recorded together."""

from __future__ import annotations

import logging
import queue

from tasks.batches.events import publish_lines
from tasks.batches.line_outcomes import LineOutcome, finish_lines
from tasks.batches.models import BatchLine, LineStatus
from tasks.messages.embeddings import EmbedRequest
from tasks.messages.generation import FinishReason
from worker.engine.embedding.jobs import EmbeddingResult
from worker.serving.embeddings.handler import stored_result, submit_embed
from worker.serving.generation import ENGINE_CHECK_S
from worker.serving.task_runner import TaskRunner

logger = logging.getLogger(__name__)


def embed_lines(runner: TaskRunner, batch_id: str, owner: str, lines: list[BatchLine]) -> None:
    """Runs `lines` (claimed by `owner`) and records their results; if the engine stops first, records nothing: the
    lines' lease lapses and they run again."""
    answers: queue.Queue[EmbeddingResult] = queue.Queue()
    line_of = {}
    for line in lines:
        request = EmbedRequest.from_dict(line.request or {})
        line_of[request.request_id] = line
        submit_embed(runner.engine, request, answers.put)
    outcomes: dict[int, LineOutcome] = {}
    while len(outcomes) < len(lines):
        try:
            result = answers.get(timeout=ENGINE_CHECK_S)
        except queue.Empty:
            if not runner.engine.is_alive():
                logger.error("the engine stopped; the embeddings lines of %s will lapse and run again", batch_id)
                return
            continue
        outcomes[line_of[result.request_id].id] = line_outcome(result)
    line_by_id = {line.id: line for line in lines}
    with runner.sessions() as session:

        def publish(recorded: dict[int, LineStatus]) -> None:
            events = [(line_by_id[line_id], status) for line_id, status in recorded.items()]
            publish_lines(runner.redis, runner.config, session, batch_id, events)

        recorded = finish_lines(session, owner, outcomes, publish)
    for status in recorded.values():
        runner.metrics.count_line(status)
    logger.info("embeddings chunk of %s: %d lines recorded", batch_id, len(recorded))


def line_outcome(result: EmbeddingResult) -> LineOutcome:
    text, error = stored_result(result)
    if error is not None:
        return LineOutcome(LineStatus.FAILED, error=error.to_dict())
    return LineOutcome(LineStatus.COMPLETED, text, FinishReason.STOP.value)
