"""steering/running_stats.py: count, mean, max and firing frequency per chosen feature."""

from __future__ import annotations

import pytest
import torch

from steering.running_stats import RunningFeatureStats


def test_accumulates_over_updates() -> None:
    stats = RunningFeatureStats("tiny/resid_post_2", [4, 9])
    stats.update(torch.tensor([[1.0, 0.0], [3.0, 0.0]]))
    stats.update(torch.tensor([[0.0, 2.0]]))
    stats.update(torch.zeros(0, 2))
    assert stats.snapshot() == {
        "sae_id": "tiny/resid_post_2",
        "count": 3,
        "features": [
            {"index": 4, "mean": pytest.approx(4 / 3), "max": 3.0, "frequency": pytest.approx(2 / 3)},
            {"index": 9, "mean": pytest.approx(2 / 3), "max": 2.0, "frequency": pytest.approx(1 / 3)},
        ],
    }


def test_empty_and_reset_snapshots_are_zeros() -> None:
    stats = RunningFeatureStats("x", [1])
    empty = {"sae_id": "x", "count": 0, "features": [{"index": 1, "mean": 0.0, "max": 0.0, "frequency": 0.0}]}
    assert stats.snapshot() == empty
    stats.update(torch.tensor([[5.0]]))
    stats.reset()
    assert stats.snapshot() == empty


def test_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="distinct feature indices"):
        RunningFeatureStats("x", [1, 1])
    with pytest.raises(ValueError, match="distinct feature indices"):
        RunningFeatureStats("x", [])
    with pytest.raises(ValueError, match=r"expected activations \[P, 2\]"):
        RunningFeatureStats("x", [1, 2]).update(torch.zeros(3, 5))
