"""A bench's stack stops with the bench, even when the bench is ended by SIGTERM: the stack's processes run in
sessions of their own, so nothing else would stop them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import free_port

REPO_ROOT = Path(__file__).resolve().parents[3]
# A bench that starts its stack, says which processes it runs, and waits to be killed.
BENCH = """
import json, sys, time
from bench.service.batch_stack import bench_config, running_stack
with running_stack(bench_config(sys.argv[1])) as stack:
    print(json.dumps([process.popen.pid for process in stack.processes]), flush=True)
    time.sleep(600)
"""


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a child the bench has reaped is gone; a zombie is not running
        return stat.read().split()[2] != "Z"


def test_a_bench_ended_by_sigterm_stops_its_stack(tiny_model_dir: Path) -> None:
    env = {**os.environ, "EMBEDDED_REDIS_PORT": str(free_port())}
    bench = subprocess.Popen(
        [sys.executable, "-c", BENCH, str(tiny_model_dir)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        pids = json.loads(bench.stdout.readline())
        assert pids and all(is_running(pid) for pid in pids)
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=60)
        deadline = time.monotonic() + 10
        while any(is_running(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in pids if is_running(pid)], "the stack outlived its bench"
    finally:
        bench.kill()
