"""Logging set-up, the same in every process."""

from __future__ import annotations

import logging

from tasks.config import Config


def configure_logging(config: Config) -> None:
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
