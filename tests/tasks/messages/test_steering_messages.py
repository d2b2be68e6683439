"""Steering and monitor messages: JSON round trips, the steering key, clamping and the monitor's size bound."""

from __future__ import annotations

import json
import math

import pytest

from tasks.messages.steering import (
    MonitoredPosition,
    MonitorPositions,
    MonitorSpec,
    SteeringFeature,
    SteeringSpec,
    SteeringVector,
)

SPEC = SteeringSpec(
    "tiny/resid_post_2",
    (SteeringFeature(3, 8.0), SteeringFeature(1, -2.5)),
    (SteeringVector(1, 0.5, values=(0.1, 0.2)), SteeringVector(2, 1.0, path="happy.safetensors")),
)


def test_messages_survive_json() -> None:
    monitor = MonitorSpec("tiny/resid_post_2", top_k=3, features=(4, 2), positions=MonitorPositions.LAST)
    position = MonitoredPosition(7, 42, ((4, 1.5), (2, 0.25)))
    assert SteeringSpec.from_dict(json.loads(json.dumps(SPEC.to_dict()))) == SPEC
    assert MonitorSpec.from_dict(json.loads(json.dumps(monitor.to_dict()))) == monitor
    assert MonitoredPosition.from_dict(json.loads(json.dumps(position.to_dict()))) == position


def test_the_echo_leaves_vector_values_out() -> None:
    echo = SPEC.echo_dict()
    assert echo["features"] == [{"index": 3, "strength": 8.0}, {"index": 1, "strength": -2.5}]
    assert echo["vectors"] == [
        {"layer": 1, "strength": 0.5, "path": None},
        {"layer": 2, "strength": 1.0, "path": "happy.safetensors"},
    ]


def test_the_key_names_the_steering_state_and_is_empty_when_unsteered() -> None:
    assert SteeringSpec().key == SteeringSpec("tiny/resid_post_2", ()).key == ""
    assert len(SPEC.key) == 64
    assert SPEC.key == SteeringSpec.from_dict(SPEC.to_dict()).key
    other_strength = SteeringSpec(SPEC.sae_id, (SteeringFeature(3, 8.5), SPEC.features[1]), SPEC.vectors)
    assert other_strength.key != SPEC.key


def test_clamping_limits_strengths_and_refuses_non_finite_ones() -> None:
    clamped = SPEC.clamped(2.0)
    assert [f.strength for f in clamped.features] == [2.0, -2.0]
    assert [v.strength for v in clamped.vectors] == [0.5, 1.0]
    with pytest.raises(ValueError, match="finite"):
        SteeringSpec("x", (SteeringFeature(0, math.nan),)).clamped(2.0)


@pytest.mark.parametrize(
    ("positions", "expected"),
    [
        (MonitorPositions.PROMPT, 10 * 4),
        (MonitorPositions.COMPLETION, 4 * 4),
        (MonitorPositions.ALL, 14 * 4),
        (MonitorPositions.LAST, 4),
    ],
)
def test_the_monitor_bound_counts_positions_the_model_reads(positions: MonitorPositions, expected: int) -> None:
    assert MonitorSpec("s", top_k=4, positions=positions).max_values(num_prompt_tokens=10, max_tokens=5) == expected
