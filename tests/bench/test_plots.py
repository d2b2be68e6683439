"""The plot script imports both benchmarks' outputs into its data file and draws a PNG from each."""

from __future__ import annotations

import json
from pathlib import Path

from bench.metrics import COLUMNS
from bench.plots import ENGINE_PLOT, LOAD_PLOT, main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def engine_markdown() -> str:
    cells = ["all-at-t=0", "(i) HF generate, one request at a time", "2", "8", "8", "0.10", "80.0", "5", "9"]
    row = "| " + " | ".join([*cells, "1.0", "2.0", "1.00x", "—", "2/2"]) + " |"
    return "\n\n".join(
        [
            "Machine: a test CPU",
            "Command: `.venv/bin/python -m bench.engine_throughput --repeats 2`",
            "| " + " | ".join(COLUMNS) + " |\n|" + "|".join("---" for _ in COLUMNS) + "|\n" + row,
            "Output tok/s of each round:",
            "- all-at-t=0, (i) HF generate, one request at a time: 80, 90",
            "Ratios within each round:",
            "- all-at-t=0, (iv) steerbatch ContinuousEngine / (i) HF generate, one request at a time: 2.00x, 3.00x",
        ]
    )


def load_report() -> dict:
    numbers = {"tokens_per_s": 100.0, "ttft_p50_ms": 10.0, "ttft_p99_ms": 20.0}
    return {
        "command": ".venv/bin/python -m bench.service.service_streams --concurrency-levels 1,2",
        "machine": "a test CPU",
        "settings": {"max_num_seqs": 32, "worker_concurrency": 32, "api_threads": 64, "output_len": 4},
        "levels": [{"streams": level, "median": numbers, "rounds": [numbers]} for level in (1, 2)],
    }


def test_imports_both_outputs_then_draws_both_plots(tmp_path: Path) -> None:
    (tmp_path / "engine.md").write_text(engine_markdown())
    (tmp_path / "load.json").write_text(json.dumps(load_report()))
    data, out_dir = tmp_path / "data" / "benchmarks.json", tmp_path / "img"
    argv = ["--data", str(data), "--out-dir", str(out_dir), "--commit", "abc1234"]

    assert (
        main([*argv, "--engine-table", str(tmp_path / "engine.md"), "--service-load", str(tmp_path / "load.json")]) == 0
    )

    imported = json.loads(data.read_text())
    engine = imported["engine_throughput"]
    assert (engine["commit"], engine["machine"]) == ("abc1234", "a test CPU")
    assert engine["command"] == ".venv/bin/python -m bench.engine_throughput --repeats 2"
    [row] = engine["rows"]
    assert (row["output_tok_s"], row["ttft_p99_ms"], row["round_tok_s"]) == (80.0, 9.0, [80.0, 90.0])
    assert imported["service_load"] == {"commit": "abc1234", **load_report()}
    for name in (ENGINE_PLOT, LOAD_PLOT):
        assert (out_dir / name).read_bytes().startswith(PNG_SIGNATURE)

    (out_dir / ENGINE_PLOT).unlink()
    assert main(argv) == 0  # redrawn from the data file alone
    assert (out_dir / ENGINE_PLOT).exists()
    assert json.loads(data.read_text()) == imported

    assert (
        main([*argv, "--engine-table", str(tmp_path / "engine.md"), "--engine-section", "engine_throughput_135m"]) == 0
    )
    assert json.loads(data.read_text()) == {**imported, "engine_throughput_135m": engine}  # beside the first
    assert (out_dir / "engine_throughput_135m.png").read_bytes().startswith(PNG_SIGNATURE)
