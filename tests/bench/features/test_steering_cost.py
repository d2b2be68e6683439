"""The steering benchmark end to end on a few tiny requests: one row per mix, the unsteered one at 1.00x."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.features.steering_cost import is_steered, main


def test_a_small_run_prints_one_row_per_mix(tiny_model_dir: Path, tiny_sae_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "table.md"
    argv = ["--model", str(tiny_model_dir), "--sae-root", str(tiny_sae_root), "--num-requests", "4"]
    argv += ["--prompt-len", "4", "8", "--output-len", "3", "3", "--repeats", "1", "--threads", "1", "--out", str(out)]

    assert main(argv) == 0

    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| ")][1:]
    assert [row[0].strip() for row in rows] == ["0%", "50%", "100%"]
    assert rows[0][-1].strip() == "1.00x"
    assert all(row[2].strip() == "12" and float(row[4]) > 0 for row in rows)


@pytest.mark.parametrize(("fraction", "expected"), [(0.0, 0), (0.5, 16), (1.0, 32)])
def test_steered_rows_are_spread_evenly(fraction: float, expected: int) -> None:
    steered = [index for index in range(32) if is_steered(index, fraction)]
    assert len(steered) == expected
    assert fraction != 0.5 or steered == list(range(1, 32, 2))
