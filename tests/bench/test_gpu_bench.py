"""bench/gpu.py end to end at a tiny size on the CPU (the graph engine's steps replayed eagerly, the Triton kernels
under the interpreter): every engine on its scenarios, the roofline and the targets, the report written."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gpu import main
from tests.bench.test_engine_throughput import table_rows

pytestmark = pytest.mark.usefixtures("tiny_model_dir")  # the tiny size takes its vocabulary from it
ENGINES = {
    "(i) ": {"batch 1"},
    "(ii)": {"batch 1", "batch 2"},
    "(iii": {"batch 1", "batch 2", "poisson"},
    "(iv)": {"batch 1", "batch 2", "poisson"},
}


def test_every_engine_runs_its_scenarios_and_the_report_has_the_roofline(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "gpu.md"
    argv = ["--size", "tiny", "--device", "cpu", "--dtype", "float32", "--batches", "1,2", "--output-len", "3"]
    argv += ["--prompt-len", "4", "8", "--poisson-requests", "3", "--poisson-rate", "50", "--out", str(out)]

    assert main(argv) == 0

    markdown = out.read_text()
    assert markdown.strip() in capsys.readouterr().out
    rows = table_rows(markdown)
    for prefix, workloads in ENGINES.items():
        assert {row["workload"] for row in rows if row["engine"].startswith(prefix)} == workloads
    assert sum("graph steps replayed eagerly" in row["engine"] for row in rows) == 3
    for row in rows:
        assert row["useful tokens"] == str(3 * int(row["requests"]))
        assert float(row["output tok/s"]) > 0
    assert "HBM roofline at batch 1:" in markdown
    assert "- batch 1: ours with graphs 2x ours eager: " in markdown
    assert "- batch 64: ours with graphs 3x HF static cache: not measured" in markdown
