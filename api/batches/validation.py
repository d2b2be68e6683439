"""Batch input files validated in the background, so POST /v1/batches answers at once with the batch `validating`
(as OpenAI's does), whatever the file's size.

Validation runs in the api, which has what it needs (the tokenizer and chat template, the SAE listings, the checks
of the interactive endpoints), not in a worker, whose Python time belongs to its engine thread. Each api process has
one validator thread (a greenlet under gevent), started with its first batch, which validates the batches that
process took: up to MAX_ACTIVE_VALIDATIONS at once, a slice of lines of each in turn, so one tenant's huge file
neither holds a request thread nor keeps another tenant's small one waiting behind it; more wait their turn in
order. Every few milliseconds of work it pauses for one, so requests run while it works.

Each slice of lines goes into the ledger in one transaction that also renews the batch's validation lease; a cancel
stops it at the next slice. If the process dies mid-way the lease lapses and the reaper (tasks/reapers/batch_reaper.py)
fails the batch, each line already in the ledger failed with it; an exception while validating fails it at once."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, current_app
from sqlalchemy.orm import Session

from api.batches.batch_objects import line_row
from api.batches.lines import iter_lines, parse_line
from api.services import services
from tasks.batches.events import publish_status
from tasks.batches.finalize import close_batch, fail_validation
from tasks.batches.models import BatchRecord, BatchStatus, FileRecord
from tasks.batches.store import MAX_BATCH_ERRORS, add_lines, renew_validation_leases, start_validated
from tasks.celery_app import enqueue_chunk
from tasks.reapers.batch_reaper import dispatch_and_enqueue

logger = logging.getLogger(__name__)
SLICE_LINES = 64  # lines per ledger transaction (and lease renewal): a few ms of the database at a time
# Validating holds the GIL (a gthread api) or the event loop (gevent): every WORK_BETWEEN_PAUSES_S of it, it pauses
# PAUSE_S, a timed sleep, so that waiting requests run and sockets are polled first (a sleep(0) under gevent runs
# ready greenlets without polling sockets, and /health's p99 reached 130 ms).
WORK_BETWEEN_PAUSES_S = 0.005
PAUSE_S = 0.001
MAX_ACTIVE_VALIDATIONS = 4  # files held in memory and validated in turn by one api process
EMPTY_FILE = {"code": "empty_file", "message": "The input file has no lines.", "param": None, "line": None}
VALIDATION_FAILED = {
    "code": "validation_failed",
    "message": "The server had an error validating the input file.",
    "param": None,
    "line": None,
}
_EXTENSION = "batch_validator"
_CREATE_LOCK = threading.Lock()


@dataclass
class Validation:
    """One batch's validation under way: where it is in its file and what it has seen."""

    batch_id: str
    endpoint: str
    tenant: str
    lines: Iterator[tuple[int, bytes]]
    started: float = field(default_factory=time.monotonic)
    seen_custom_ids: set[str] = field(default_factory=set)
    errors: list[dict[str, Any]] = field(default_factory=list)  # the first MAX_BATCH_ERRORS, kept on the batch
    num_lines: int = 0
    num_invalid: int = 0
    model: str | None = None  # what its first valid line names; every line must name it


def batch_validator() -> BatchValidator:
    """This app's validator, made on first use."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    with _CREATE_LOCK:
        if _EXTENSION not in app.extensions:
            app.extensions[_EXTENSION] = BatchValidator(app)
        return app.extensions[_EXTENSION]


class BatchValidator:
    def __init__(self, app: Flask) -> None:
        self._app = app
        self._submitted: queue.Queue[str] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._worked_since = time.monotonic()

    def submit(self, batch_id: str) -> None:
        """Validate a batch just recorded as validating (with its lease), after those submitted before it."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="batch-validator", daemon=True)
                self._thread.start()
        self._submitted.put(batch_id)

    def _run(self) -> None:
        waiting: deque[str] = deque()
        active: list[Validation] = []
        with self._app.app_context():
            while True:
                try:
                    active = self._cycle(waiting, active)
                except Exception:  # the database or Redis away: leases lapse and the reaper fails those batches
                    logger.exception("batch validation failed; dropping %d validations", len(active))
                    active = []
                    time.sleep(1)

    def _cycle(self, waiting: deque[str], active: list[Validation]) -> list[Validation]:
        """Take what was submitted (waiting for it when idle), then a slice of each active validation."""
        try:
            waiting.append(self._submitted.get(block=not waiting and not active))
            while True:
                waiting.append(self._submitted.get_nowait())
        except queue.Empty:
            pass
        while waiting and len(active) < MAX_ACTIVE_VALIDATIONS:
            opened = self._open(waiting.popleft())
            if opened is not None:
                active.append(opened)
        active = [validation for validation in active if self._advance_or_fail(validation)]
        if waiting:
            svc = services()
            with svc.sessions() as session:
                renew_validation_leases(session, list(waiting), time.time() + svc.config.batch_validation_lease_s)
        return active

    def _open(self, batch_id: str) -> Validation | None:
        with services().sessions() as session:
            batch = session.get(BatchRecord, batch_id)
            if batch is None or batch.status != BatchStatus.VALIDATING.value:
                return None  # cancelled while it waited
            input_file = session.get(FileRecord, batch.input_file_id)
            content = b"" if input_file is None else input_file.content  # a file deleted meanwhile has no lines
            return Validation(batch.id, batch.endpoint, batch.tenant, iter_lines(content))

    def _advance_or_fail(self, validation: Validation) -> bool:
        try:
            return self._advance(validation)
        except Exception:
            logger.exception("batch %s: validation failed", validation.batch_id)
            svc = services()
            with svc.sessions() as session:
                if fail_validation(session, validation.batch_id, VALIDATION_FAILED):
                    publish_status(svc.redis, svc.config, session, validation.batch_id)
            return False

    def _advance(self, validation: Validation) -> bool:
        """Validate and record the next slice of lines; False once the batch is done or no longer validating."""
        svc = services()
        rows = []
        for line_no, raw in itertools.islice(validation.lines, SLICE_LINES):
            parsed = parse_line(
                validation.model,
                line_no,
                raw,
                validation.endpoint,
                validation.tenant,
                validation.seen_custom_ids,
                svc.config.max_request_bytes,
            )
            rows.append(line_row(validation.batch_id, parsed))
            if parsed.request is not None:
                validation.model = parsed.request.model
            if parsed.error is not None:
                validation.num_invalid += 1
                if len(validation.errors) < MAX_BATCH_ERRORS:
                    validation.errors.append(parsed.error)
            self._pause_if_due()
        validation.num_lines += len(rows)
        with svc.sessions() as session:
            lease_expires_at = time.time() + svc.config.batch_validation_lease_s
            if not add_lines(session, validation.batch_id, rows, lease_expires_at):
                logger.info("batch %s: no longer validating; stopped", validation.batch_id)
                return False
            if len(rows) < SLICE_LINES:
                self._finish(session, validation)
                return False
        return True

    def _pause_if_due(self) -> None:
        if time.monotonic() - self._worked_since >= WORK_BETWEEN_PAUSES_S:
            time.sleep(PAUSE_S)
            self._worked_since = time.monotonic()

    def _finish(self, session: Session, validation: Validation) -> None:
        """Every line is in the ledger: the batch in progress with its first chunks dispatched, or failed."""
        svc = services()
        errors = validation.errors or ([] if validation.num_lines else [EMPTY_FILE])
        if start_validated(session, validation.batch_id, errors, validation.model):
            publish_status(svc.redis, svc.config, session, validation.batch_id)
            dispatch_and_enqueue(session, svc.config, lambda chunk: enqueue_chunk(svc.celery, svc.config, chunk))
        elif close_batch(session, validation.batch_id, BatchStatus.VALIDATING, BatchStatus.FAILED):
            publish_status(svc.redis, svc.config, session, validation.batch_id)
        logger.info(
            "batch %s: %d lines validated in %.1f s, %d invalid",
            validation.batch_id,
            validation.num_lines,
            time.monotonic() - validation.started,
            validation.num_invalid,
        )
