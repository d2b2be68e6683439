"""The service-streams benchmark end to end on two tiny requests: both sides measured, on a real stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.service.service_streams import main


def test_a_small_run_measures_the_engine_and_the_service(tiny_model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--model", str(tiny_model_dir), "--num-requests", "2", "--prompt-len", "4", "8", "--output-len", "4"]

    assert main([*argv, "--rounds", "1", "--no-peer"]) == 0

    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in out.splitlines() if line.startswith("| ")}
    for label in ("engine in process", "through the service"):
        rate, median_rate, ttft, median_ttft, _ = (cell.strip() for cell in rows[label])
        assert float(rate) == float(median_rate) > 0 and float(ttft) == float(median_ttft) > 0
    assert float(rows["through the service"][4]) > 0, "the client's own CPU time"
    # counted apart from the worker (its 10 ms CPU ticks can read 0 over a round this small: the thread rows show work)
    assert float(rows["engine process CPU ms per output token"][1]) >= 0
    if Path("/proc/self/schedstat").exists():
        for where in ("in process", "in the service"):
            run_ms, wait_ms = (
                float(ms) for ms in rows[f"the engine thread {where}: ms on a CPU / waiting for one"][1].split("/")
            )
            assert run_ms > 0 and wait_ms >= 0
    assert "service / engine output tok/s, per round:" in out
    assert "peer (HF transformers serve): skipped, left out (--no-peer)" in out, "one line says the peer is left out"


def test_concurrency_levels_measure_ttft_at_each_level_through_one_stack(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "load.json"
    argv = ["--model", str(tiny_model_dir), "--prompt-len", "4", "8", "--output-len", "4", "--rounds", "2"]

    assert main([*argv, "--concurrency-levels", "1,3", "--json", str(out)]) == 0

    printed = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in printed.splitlines() if line.startswith("| ") and "streams" not in line]
    assert [(row[0].strip(), row[1].strip()) for row in rows] == [("1", "2"), ("3", "2")]
    report = json.loads(out.read_text())
    assert report["command"].endswith("--json " + str(out))
    assert [level["streams"] for level in report["levels"]] == [1, 3]
    for level in report["levels"]:
        assert len(level["rounds"]) == 2
        for numbers in [level["median"], *level["rounds"]]:
            assert numbers["tokens_per_s"] > 0 and 0 < numbers["ttft_p50_ms"] <= numbers["ttft_p99_ms"]


def test_json_without_levels_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["--json", str(tmp_path / "load.json")])
