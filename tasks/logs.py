"""Logging set-up, the same in every process."""

from __future__ import annotations

import logging

from tasks.config import Config

# Celery's lines per task received and per task succeeded, left out above DEBUG: a worker already logs each request's
# end (its id, finish reason and tokens), and these two were 7 % of a chat request's worker CPU in bursts (yappi)
# outside the engine. A task that fails is still logged (at ERROR), and Flower still shows every task.
PER_TASK_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


def configure_logging(config: Config) -> None:
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    is_debug = logging.getLevelName(config.log_level.upper()) == logging.DEBUG
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if is_debug else logging.WARNING)
