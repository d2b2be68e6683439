"""Logging set-up: Celery's per-task lines are left out above DEBUG, its failures never."""

from __future__ import annotations

import logging

import pytest

from tasks.config import Config
from tasks.logs import PER_TASK_LOGGERS, configure_logging


@pytest.fixture(autouse=True)
def restore_levels() -> None:
    levels = {name: logging.getLogger(name).level for name in PER_TASK_LOGGERS}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_celerys_per_task_lines_are_left_out_at_info_and_its_failures_kept() -> None:
    configure_logging(Config(log_level="INFO"))
    for name in PER_TASK_LOGGERS:
        logger = logging.getLogger(name)
        assert not logger.isEnabledFor(logging.INFO)
        assert logger.isEnabledFor(logging.ERROR)


def test_at_debug_every_line_is_kept() -> None:
    configure_logging(Config(log_level="DEBUG"))
    for name in PER_TASK_LOGGERS:
        assert logging.getLogger(name).level == logging.NOTSET
