"""scripts.cli.top renders one frame of the live stack: its model, worker, queues and KV usage."""

from __future__ import annotations

import os
import subprocess
import sys

import requests

from scripts.stack import Stack
from tasks.config import REPO_ROOT


def test_top_once_renders_the_live_stack(stack: Stack) -> None:
    ready = requests.get(f"{stack.base_url}/health/ready", timeout=10).json()
    [worker] = ready["models"][stack.config.model_name]["workers"]
    command = [sys.executable, "-m", "scripts.cli.top", "--once", "--url", stack.base_url, "--interval", "0.2"]
    env = {**os.environ, "API_KEY": stack.api_key or "", "COLUMNS": "200"}
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert stack.config.model_name in done.stdout and worker["name"] in done.stdout
    assert "TTFT p50" in done.stdout and "ready" in done.stdout


def test_top_says_why_without_a_key(stack: Stack) -> None:
    command = [sys.executable, "-m", "scripts.cli.top", "--once", "--url", stack.base_url, "--interval", "0"]
    env = {key: value for key, value in os.environ.items() if key != "API_KEY"}
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "/metrics answered 401" in done.stderr
