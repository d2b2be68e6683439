"""`make serve`'s supervision: a child of the stack that exits is started again, after a delay that doubles with
each quick death (1 s, 2 s, 4 s ... up to a minute) and resets once the child has stayed up for a while."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from scripts.stack import ManagedProcess, Stack

logger = logging.getLogger(__name__)
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 60.0
STABLE_AFTER_S = 60.0  # a child up this long is healthy again: its next death restarts it at once


@dataclass
class Backoff:
    """When a child that died may start again; pure bookkeeping, so that it is tested without processes."""

    next_delay_s: float = FIRST_DELAY_S
    started_at: float = field(default_factory=time.monotonic)

    def delay_after_death(self, now: float) -> float:
        if now - self.started_at >= STABLE_AFTER_S:
            self.next_delay_s = FIRST_DELAY_S
        delay = self.next_delay_s
        self.next_delay_s = min(self.next_delay_s * 2, MAX_DELAY_S)
        return delay

    def restarted(self, now: float) -> None:
        self.started_at = now


@dataclass
class Supervisor:
    stack: Stack
    backoffs: dict[str, Backoff] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)  # name -> when the dead child starts again

    def check(self) -> None:
        """Notices children that exited and starts those whose delay has passed; call it a few times a second."""
        now = time.monotonic()
        for process in list(self.stack.processes):
            if process.is_running() or process.name in self.due:
                continue
            delay = self.backoffs.setdefault(process.name, Backoff()).delay_after_death(now)
            code = process.popen.returncode
            logger.error("%s exited with %s; starting it again in %.0f s", process.name, code, delay)
            self.due[process.name] = now + delay
        for name, due_at in list(self.due.items()):
            if now >= due_at:
                self._restart(self.stack.process(name))

    def _restart(self, process: ManagedProcess) -> None:
        try:
            self.stack.restart(process)
        except Exception:
            logger.exception("could not start %s again; trying later", process.name)
            self.due[process.name] = time.monotonic() + self.backoffs[process.name].delay_after_death(time.monotonic())
            return
        del self.due[process.name]
        self.backoffs[process.name].restarted(time.monotonic())
        logger.info("%s started again", process.name)
