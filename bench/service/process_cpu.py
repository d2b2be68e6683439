"""CPU the stack's processes have spent, read from /proc: on a machine shared with other work, what a round cost the
service is steadier than its wall time. And the engine thread's own times, on a CPU and waiting for one: on a machine
with fewer cores than the service has busy threads, the second is what the engine loses to the processes around it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from scripts.stack import Stack

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ENGINE_PROCESS_NAME = "engine process"
# what `multiprocessing`'s spawn start method runs: the worker's engine process (`ENGINE_PROCESS=1`) is started so
SPAWNED_MARK = b"spawn_main"


@dataclass(frozen=True)
class ThreadTimes:
    """Seconds a thread has spent on a CPU and runnable but waiting for one (/proc's schedstat)."""

    run_s: float
    wait_s: float

    def __sub__(self, other: ThreadTimes) -> ThreadTimes:
        return ThreadTimes(self.run_s - other.run_s, self.wait_s - other.wait_s)


def stack_cpu_seconds(stack: Stack) -> dict[str, float]:
    """Each managed process's user + system CPU seconds, its children's included (gunicorn's worker process); the
    worker's engine process, where it has one, counted apart from it as "engine process"."""
    seconds = {}
    for process in stack.processes:
        engine_pid = engine_process_pid(process.popen.pid)
        skip = set() if engine_pid is None else {engine_pid}
        seconds[process.name] = _tree_cpu_seconds(process.popen.pid, skip)
        if engine_pid is not None:
            seconds[ENGINE_PROCESS_NAME] = _tree_cpu_seconds(engine_pid, set())
    return seconds


def engine_process_pid(pid: int) -> int | None:
    """The engine process among `pid`'s children (the worker's), if it has one."""
    for child in _children(pid):
        try:
            if SPAWNED_MARK in Path(f"/proc/{child}/cmdline").read_bytes():
                return child
        except OSError:  # ended while read
            continue
    return None


def thread_times(pid: int) -> dict[int, ThreadTimes]:
    """Each thread of `pid` by its id; empty where the kernel keeps no schedstat."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run_ns, wait_ns, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):  # the thread ended while read, or no schedstat
            continue
        times[int(task.name)] = ThreadTimes(int(run_ns) / 1e9, int(wait_ns) / 1e9)
    return times


def busiest_thread(before: dict[int, ThreadTimes], after: dict[int, ThreadTimes]) -> ThreadTimes | None:
    """What the thread that ran the most between the two readings spent between them: over a round, the engine's."""
    deltas = [after[tid] - before[tid] for tid in after.keys() & before.keys()]
    return max(deltas, key=lambda delta: delta.run_s, default=None)


def _children(pid: int) -> list[int]:
    # a child is listed under the thread that started it: the worker's engine process under a thread of its own
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:  # the thread ended while read
            continue
    return children


def _tree_cpu_seconds(pid: int, skip: set[int]) -> float:
    return _cpu_seconds(pid) + sum(_tree_cpu_seconds(child, skip) for child in _children(pid) if child not in skip)


def _cpu_seconds(pid: int) -> float:
    # after the command's closing parenthesis: state is field 3, utime and stime fields 14 and 15 (man 5 proc)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
