"""`make serve`: the whole stack in the foreground until Ctrl-C or SIGTERM, which stop every child; a child that
exits on its own is started again (scripts/supervisor.py)."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time

from scripts.flower_password import flower_basic_auth
from scripts.stack import Stack, sigterm_as_interrupt
from scripts.supervisor import Supervisor
from tasks.config import Config
from tasks.logs import configure_logging

logger = logging.getLogger("serve")


def main() -> int:
    config = Config.from_env()
    configure_logging(config)
    config = dataclasses.replace(config, flower_basic_auth=flower_basic_auth(config))
    stack = Stack(config)
    with sigterm_as_interrupt():
        try:
            stack.start(with_flower=True)
            user = config.flower_basic_auth.split(":", 1)[0]
            flower_url = f"http://{config.flower_host}:{config.flower_port}"
            logger.info("api: %s/v1   flower: %s (user %s)", stack.base_url, flower_url, user)
            logger.info("Ctrl-C stops everything")
            supervisor = Supervisor(stack)
            while True:
                supervisor.check()
                time.sleep(0.5)
        except KeyboardInterrupt:
            logger.info("stopping")
            return 0
        finally:
            stack.stop()


if __name__ == "__main__":
    sys.exit(main())
