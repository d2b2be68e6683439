"""CPU seconds the stack's processes have spent, read from /proc: on a machine shared with other work, what a round
cost the service is steadier than its wall time."""

from __future__ import annotations

import os
from pathlib import Path

from scripts.stack import Stack

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def stack_cpu_seconds(stack: Stack) -> dict[str, float]:
    """Each managed process's user + system CPU seconds, its children's included (gunicorn's worker process)."""
    return {process.name: _tree_cpu_seconds(process.popen.pid) for process in stack.processes}


def _tree_cpu_seconds(pid: int) -> float:
    # a child is listed under the thread that started it: the worker's engine process under a thread of its own
    children = [
        int(child) for task in Path(f"/proc/{pid}/task").iterdir() for child in (task / "children").read_text().split()
    ]
    return _cpu_seconds(pid) + sum(_tree_cpu_seconds(child) for child in children)


def _cpu_seconds(pid: int) -> float:
    # after the command's closing parenthesis: state is field 3, utime and stime fields 14 and 15 (man 5 proc)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
