"""The command-line client: upload, run, progress, and the output and error files on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from scripts.cli.batch_client import main
from scripts.stack import Stack
from tests.service.batch_helpers import chat_line
from tests.service.http import auth


def count_batches(stack: Stack) -> int:
    return len(requests.get(f"{stack.base_url}/v1/batches?limit=100", headers=auth(stack), timeout=10).json()["data"])


def test_submit_writes_the_output_and_error_files_and_a_key_resumes(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEERBATCH_API_KEY", stack.api_key or "")  # where the client takes its key from
    prompts = tmp_path / "prompts.jsonl"
    lines = [json.dumps(chat_line(stack, f"p-{i}", max_tokens=3)) for i in range(3)] + ["not json"]
    prompts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "results.jsonl"
    args = ["submit", str(prompts), "--out", str(out), "--base-url", f"{stack.base_url}/v1", "--poll-s", "0.1"]
    assert main([*args, "--idempotency-key", "cli-run"]) == 0
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(result["custom_id"] for result in results) == ["p-0", "p-1", "p-2"]
    [error] = [json.loads(line) for line in (tmp_path / "results.errors.jsonl").read_text().splitlines()]
    assert error["error"]["line"] == 4 and error["error"]["code"] == "invalid_json"

    num_batches = count_batches(stack)
    out.unlink()
    assert main([*args, "--idempotency-key", "cli-run"]) == 0
    assert len(out.read_text().splitlines()) == 3
    assert count_batches(stack) == num_batches


def test_a_wrong_key_is_refused_with_a_message(stack: Stack, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(chat_line(stack, "p", max_tokens=3)) + "\n")
    args = ["submit", str(prompts), "--out", str(tmp_path / "out.jsonl"), "--base-url", f"{stack.base_url}/v1"]
    assert main([*args, "--api-key", "sb-wrong"]) == 1
    assert "refused the key" in caplog.text and not (tmp_path / "out.jsonl").exists()
