"""What the engine process sends up: a step's outputs in one message as the step ends, from the engine thread (no
thread woken mid-step to take the GIL from it), outputs from outside a step at once, and nothing raised into the
engine's step when the worker is gone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection

import pytest

from tasks.config import Config
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineOutput
from worker.engine.model_runner import ModelRunner
from worker.engine_process import wire
from worker.engine_process.step_sender import HEARTBEAT_S, StepSender

QUIET_S = 0.3  # long enough for a sender thread woken by an output to have sent it


@pytest.fixture(scope="module")
def engine(tiny_config: Config) -> ContinuousEngine:
    return ContinuousEngine(ModelRunner(tiny_config), tiny_config)  # for its load and stats; never started


@pytest.fixture
def pipe(engine: ContinuousEngine) -> Iterator[tuple[StepSender, Connection, Connection]]:
    received, sent = Pipe(duplex=False)
    sender = StepSender(sent)
    sender.start(engine)
    yield sender, received, sent
    sender.stop()


def outputs_of(message: dict) -> list[EngineOutput]:
    assert message["kind"] == wire.STEP
    return [EngineOutput.from_dict(data) for data in message["outputs"]]


def next_outputs(received: Connection, timeout_s: float) -> list[EngineOutput] | None:
    """The outputs of the next message that has any (an idle heartbeat carries none), or None within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while received.poll(max(deadline - time.monotonic(), 0)):
        outputs = outputs_of(wire.receive(received))
        if outputs:
            return outputs
    return None


def test_a_steps_outputs_go_up_in_one_message_as_it_ends(pipe: tuple[StepSender, Connection, Connection]) -> None:
    sender, received, _ = pipe
    step = [EngineOutput("a", [5]), EngineOutput("b", [6]), EngineOutput("a", [7])]
    with sender.step_scope():
        sender.on_output(step[0])
        assert next_outputs(received, QUIET_S) is None, "an output went up before its step ended"
        for output in step[1:]:
            sender.on_output(output)
    assert next_outputs(received, HEARTBEAT_S) == step
    assert next_outputs(received, QUIET_S) is None


def test_an_output_from_outside_a_step_goes_up_at_once(pipe: tuple[StepSender, Connection, Connection]) -> None:
    sender, received, _ = pipe
    abort = EngineOutput("cancelled", [], error="cancelled")
    started = time.monotonic()
    sender.on_output(abort)
    assert next_outputs(received, HEARTBEAT_S / 2) == [abort]  # sent when it came, not with the next heartbeat
    assert time.monotonic() - started < HEARTBEAT_S / 2


def test_the_first_message_carries_the_engines_load(pipe: tuple[StepSender, Connection, Connection]) -> None:
    sender, received, _ = pipe
    with sender.step_scope():
        sender.on_output(EngineOutput("a", [5]))
    message = wire.receive(received)
    assert message["load"]["num_blocks"] > 0 and "num_steps" in message["stats"]


def test_a_step_that_ends_after_the_worker_went_away_raises_nothing(
    pipe: tuple[StepSender, Connection, Connection],
) -> None:
    sender, received, _ = pipe
    received.close()
    with sender.step_scope():  # the engine thread's send fails; the reader sees the pipe close and stops the engine
        sender.on_output(EngineOutput("a", [5]))
