"""The benchmark end to end on a few tiny requests: every row present, numbers sane, tokens equal to (i)'s."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.engine_throughput import main
from bench.metrics import COLUMNS
from bench.workload import WorkloadSpec, make_workload

NUM_REQUESTS = 3


def table_rows(markdown: str) -> list[dict[str, str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert tuple(header) == COLUMNS
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True)) for line in lines[2:]]


def test_two_engines_on_both_workloads(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "table.md"
    argv = ["--model", str(tiny_model_dir), "--num-requests", str(NUM_REQUESTS), "--prompt-len", "4", "12"]
    argv += ["--output-len", "3", "6", "--poisson-rate", "50", "--engines", "naive,steerbatch", "--out", str(out)]

    assert main(argv) == 0

    markdown = out.read_text()
    assert markdown.strip() in capsys.readouterr().out
    rows = table_rows(markdown)
    assert [(row["workload"], row["engine"][:4]) for row in rows] == [
        ("all-at-t=0", "(i) "),
        ("all-at-t=0", "(iv)"),
        ("poisson", "(i) "),
        ("poisson", "(iv)"),
    ]
    for row in rows:
        assert row["requests"] == str(NUM_REQUESTS)
        assert float(row["output tok/s"]) > 0
        assert float(row["TTFT p50 ms"]) <= float(row["TTFT p99 ms"])
        assert row["same tokens as (i)"] == f"{NUM_REQUESTS}/{NUM_REQUESTS}"
        assert row["x (ii)"] == "—"
    assert {row["x (i)"] for row in rows if row["engine"].startswith("(i) ")} == {"1.00x"}


def test_repeats_show_the_median_round_every_round_and_ratios_within_rounds(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["--model", str(tiny_model_dir), "--num-requests", "2", "--prompt-len", "4", "8", "--output-len", "2", "3"]
    argv += ["--engines", "naive,steerbatch", "--repeats", "3"]

    assert main(argv) == 0

    markdown = capsys.readouterr().out
    rows = table_rows(markdown)
    listed = [line for line in markdown.splitlines() if line.startswith("- ")]
    rounds = {line.split(": ")[0]: line.split(": ")[1] for line in listed if " / " not in line}
    for row in rows:
        values = sorted(float(value) for value in rounds[f"- {row['workload']}, {row['engine']}"].split(", "))
        assert len(values) == 3
        assert float(row["output tok/s"]) == pytest.approx(values[1], abs=1)  # median of three, as shown
    ratios = [line for line in listed if " / " in line]
    assert len(ratios) == 2  # ours against (i), per workload
    for line in ratios:
        per_round = [float(value.rstrip("x")) for value in line.split(": ")[1].split(" (median")[0].split(", ")]
        assert len(per_round) == 3 and all(ratio > 0 for ratio in per_round)


def test_workload_is_seeded_and_avoids_special_tokens() -> None:
    spec = WorkloadSpec(num_requests=8, prompt_len_range=(5, 9), output_len_range=(2, 4), seed=7)
    burst = make_workload("a", spec, vocab_size=16, special_token_ids={0, 1, 4}, poisson_rate_per_s=None)
    stream = make_workload("b", spec, vocab_size=16, special_token_ids={0, 1, 4}, poisson_rate_per_s=10.0)

    assert [r.prompt_token_ids for r in burst] == [r.prompt_token_ids for r in stream]
    assert all(5 <= len(r.prompt_token_ids) <= 9 and 2 <= r.num_output_tokens <= 4 for r in burst)
    assert not {0, 1, 4} & {token for r in burst for token in r.prompt_token_ids}
    assert {r.arrival_s for r in burst} == {0.0}
    arrivals = [r.arrival_s for r in stream]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals) and arrivals[-1] > 0
