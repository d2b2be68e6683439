"""Where an engine step's time goes: the same 32 requests as bench.engine_throughput's all-at-t=0 workload,
stepped on this thread, timed per phase (schedule, forward, sample + update + emit), then one torch.profiler
table of the operators of a stretch of decode steps.

    .venv/bin/python -m bench.engine_profile --model models/tiny [--threads 1] [--steps 20] [--compile]
        [--random-config 135m]
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from bench.random_model import SIZES, random_model_dir
from bench.workload import WorkloadSpec, make_workload
from tasks.config import Config
from tasks.logs import configure_logging
from tasks.messages.generation import SamplingParams
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--random-config", choices=sorted(SIZES), help="a random-init model of this size instead")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--steps", type=int, default=20, help="decode steps under the profiler")
    parser.add_argument("--compile", action="store_true", help="TORCH_COMPILE: the forward under torch.compile")
    return parser.parse_args(argv)


def loaded_engine(runner: ModelRunner, config: Config, seed: int = 0) -> ContinuousEngine:
    """An engine, not started, holding the workload's requests (EOS ignored); a new seed gives new prompts, which
    the runner's prefix cache has not seen."""
    engine = ContinuousEngine(runner, config)
    spec = WorkloadSpec(num_requests=32, prompt_len_range=(32, 256), output_len_range=(64, 128), seed=seed)
    for request in make_workload("profile", spec, runner.model.config.vocab_size, runner.eos_token_ids, None):
        sampling = SamplingParams(max_tokens=request.num_output_tokens, temperature=0.0, ignore_eos=True)
        engine.submit(EngineRequest(request.request_id, request.prompt_token_ids, sampling), lambda _: None)
    engine.take_new_work()
    return engine


def time_phases(engine: ContinuousEngine, runner: ModelRunner) -> tuple[int, dict[str, float]]:
    """Runs the workload to the end through the engine's own step; seconds per phase over all steps."""
    seconds: dict[str, float] = defaultdict(float)

    def timed(name: str, method: Callable[..., object]) -> Callable[..., object]:
        def run_timed(*args: object, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - started

        return run_timed

    scheduler = engine._scheduler
    runner.run = timed("forward (step tensors + model)", runner.run)  # type: ignore[method-assign]
    scheduler.schedule = timed("schedule", scheduler.schedule)  # type: ignore[method-assign]
    num_steps = 0
    try:
        while scheduler.has_work:
            started = time.perf_counter()
            engine.step()
            seconds["step"] += time.perf_counter() - started
            num_steps += 1
    finally:
        del runner.run, scheduler.schedule
    seconds["step"] -= seconds["forward (step tensors + model)"] + seconds["schedule"]
    seconds["propose, sample, update, emit"] = seconds.pop("step")
    return num_steps, seconds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(Config())
    torch.set_num_threads(args.threads)
    model = args.model if args.random_config is None else str(random_model_dir(args.random_config, torch.float32))
    config = Config(
        model=model,
        device="cpu",
        dtype="float32",
        max_num_seqs=32,
        cpu_threads=args.threads,
        torch_compile=args.compile,
    )
    runner = ModelRunner(config)
    with torch.inference_mode():
        time_phases(loaded_engine(runner, config, seed=1), runner)  # warm-up, on other prompts
        started = time.perf_counter()
        num_steps, seconds = time_phases(loaded_engine(runner, config), runner)
        total = time.perf_counter() - started
        print(f"{num_steps} steps in {total:.3f}s, {total / num_steps * 1e3:.2f} ms/step, {args.threads} threads")
        for name, value in seconds.items():
            print(f"  {name:<13} {value / num_steps * 1e3:6.2f} ms/step  {value / total:6.1%}")
        engine = loaded_engine(runner, config, seed=2)
        for _ in range(8):  # past the prefill, into decode-only steps
            engine.step()
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(args.steps):
                engine.step()
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
