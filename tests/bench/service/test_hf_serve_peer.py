"""HF `transformers serve` as the service-streams benchmark's peer: started by the bench on the same model, measured in
the same rounds as the engine and the service, and stopped again."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from bench.service import hf_serve_peer
from bench.service.service_streams import PEER_LABEL, main


@pytest.mark.skipif(hf_serve_peer.peer_missing() is not None, reason=str(hf_serve_peer.peer_missing()))
def test_the_peer_is_measured_in_the_same_rounds_and_stopped_after(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["--model", str(tiny_model_dir), "--num-requests", "2", "--prompt-len", "4", "8", "--output-len", "4"]
    children_before = set(psutil.Process().children(recursive=True))

    assert main([*argv, "--rounds", "1"]) == 0

    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in out.splitlines() if line.startswith("| ")}
    rate, median_rate, ttft, median_ttft, client_cpu = (cell.strip() for cell in rows[PEER_LABEL])
    assert float(rate) == float(median_rate) > 0 and float(ttft) == float(median_ttft) > 0
    assert float(client_cpu) >= 0
    assert "service / peer output tok/s, per round:" in out and "skipped" not in out
    left = [p for p in psutil.Process().children(recursive=True) if p not in children_before and p.is_running()]
    assert not [p for p in left if "serve" in " ".join(p.cmdline())], "the peer server outlived the bench"
