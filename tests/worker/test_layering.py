"""The engine side of the worker runs without Celery or Redis: ruff bans the imports in its files, and this checks
that nothing it imports brings them in either."""

from __future__ import annotations

import subprocess
import sys

from tasks.config import REPO_ROOT

ENGINE_SIDE = [
    "worker.engine.continuous_engine",
    "worker.engine.speculation.speculator",
    "worker.engine.attention.triton_step",
    "worker.kernels.cpu_decode_kernel",
    "worker.steering.steering_plan",
    "worker.text.choice",
]
PROBE = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
leaked = sorted(m for m in ("celery", "redis", "kombu") if m in sys.modules)
assert not leaked, f"the engine side imported {leaked}"
"""


def test_engine_side_imports_neither_celery_nor_redis() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *ENGINE_SIDE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
