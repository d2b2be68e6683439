"""The service-streams benchmark end to end on two tiny requests: both sides measured, on a real stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.service_streams import main


def test_a_small_run_measures_the_engine_and_the_service(tiny_model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--model", str(tiny_model_dir), "--num-requests", "2", "--prompt-len", "4", "8", "--output-len", "4"]

    assert main([*argv, "--rounds", "1"]) == 0

    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in out.splitlines() if line.startswith("| ")}
    for label in ("engine in process", "through the service"):
        rate, median, ttft = (cell.strip() for cell in rows[label])
        assert float(rate) == float(median) > 0 and float(ttft) > 0
    assert "service / engine, median rounds:" in out
