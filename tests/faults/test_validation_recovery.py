"""The api killed (SIGKILL) while it validates a batch file in the background: once the batch's validation lease
lapses, a worker's reaper fails the batch, every line already in the ledger failed with it and in the error file, and
the api started again serves as before."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from scripts.stack import Stack, launcher_key
from tests.conftest import make_test_config
from tests.faults.test_hostile_batches import COMPLETIONS_URL, ledger, upload
from tests.service.http import auth

NUM_LINES = 20_000


@pytest.fixture
def stack(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    config = make_test_config(
        tiny_model_dir,
        redis_url,
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        batch_validation_lease_s=2.0,
        batch_reaper_interval_s=0.5,
    )
    running = Stack(config, log_dir=tmp_path / "logs", api_key=launcher_key(config, "test-admin"))
    running.start()
    yield running
    running.stop()


def wait_for(condition, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen in {timeout_s} s")


def test_a_validation_cut_short_by_a_dead_api_fails_with_every_recorded_line(stack: Stack) -> None:
    model = stack.config.model_name
    lines = (
        {"custom_id": f"l-{i}", "method": "POST", "url": COMPLETIONS_URL,
         "body": {"model": model, "prompt": f"hi {i}", "max_tokens": 1}}
        for i in range(NUM_LINES)
    )  # fmt: skip
    file_id = upload(stack, "".join(json.dumps(line) + "\n" for line in lines).encode())
    body = {"input_file_id": file_id, "endpoint": COMPLETIONS_URL, "completion_window": "24h"}
    batch_id = requests.post(f"{stack.base_url}/v1/batches", json=body, headers=auth(stack), timeout=30).json()["id"]
    wait_for(lambda: ledger(stack, batch_id), 30, "validation under way")

    api = stack.process("api")
    os.killpg(api.popen.pid, signal.SIGKILL)  # gunicorn's master and its worker, mid-validation
    api.popen.wait()
    stack.restart(api)

    def batch() -> dict | None:
        try:
            reply = requests.get(f"{stack.base_url}/v1/batches/{batch_id}", headers=auth(stack), timeout=5)
        except requests.ConnectionError:
            return None  # the api is still starting
        return reply.json() if reply.json()["status"] != "validating" else None

    failed = wait_for(batch, 60, "the reaper failing the batch")
    assert failed["status"] == "failed" and failed["errors"]["data"][0]["code"] == "validation_interrupted"
    recorded = ledger(stack, batch_id)
    assert 0 < len(recorded) < NUM_LINES and all(status == "failed" for _, _, status in recorded)
    counts = failed["request_counts"]
    assert counts["total"] == counts["failed"] == len(recorded)
    error_file = requests.get(f"{stack.base_url}/v1/files/{failed['error_file_id']}/content", headers=auth(stack))
    error_lines = [json.loads(line) for line in error_file.content.splitlines()]
    assert [line["custom_id"] for line in error_lines] == [custom_id for _, custom_id, _ in recorded]
