"""What the GPU check runs, in order, as child processes: each step a command, its time limit and its environment,
the same sequence on a CUDA device and (smallest sizes, Triton under its interpreter, graphs replayed eagerly) on a
CPU. Pytest steps write JUnit XML, from which the report takes each failure's traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

KERNEL_TEST_FILES = (
    "tests/worker/kernels/test_triton_attention.py",
    "tests/worker/engine/attention/test_paged_attention_gpu.py",
    "tests/worker/engine/families/test_greedy_dtypes.py",
    "tests/worker/engine/sampling/test_host_syncs.py",
)
GRAPH_TEST_FILES = ("tests/worker/engine/graphs/test_decode_graphs.py",)
# Every family against HF: on CUDA in float32 and bfloat16 (the gpu-marked file); on a CPU on every CPU backend.
FAMILY_TEST_FILES = {
    "cuda": ("tests/worker/engine/families/test_family_gpu.py",),
    "cpu": ("tests/worker/engine/families/test_family_greedy.py",),
}
GPU_TEST_FILES = (*KERNEL_TEST_FILES, *FAMILY_TEST_FILES["cuda"], *GRAPH_TEST_FILES)
ENGINE_BENCH_MODULE = "bench.gpu"
NOT_YET_SERVED = {
    "d": (
        "quantized formats and KV dtypes that need CUDA: the formats the engine serves (torchao int8/int4 "
        "weight-only, compressed-tensors, bitsandbytes 8-bit) run and are tested on CPU; GPTQ and AWQ need "
        "gptqmodel, whose wheels pull another torch, and are refused; KV dtypes other than the model's are not "
        "served yet"
    ),
}
TAIL_LINES = 60


@dataclass(frozen=True)
class Step:
    key: str  # the issue's letter: a gpu tests, b families, c graphs, d quantized, e service, f benchmarks
    name: str
    command: tuple[str, ...]
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    junit_path: Path | None = None  # a pytest step's failures come from here
    report_path: Path | None = None  # a markdown table the step writes, which the report embeds


@dataclass
class StepResult:
    key: str
    name: str
    passed: bool
    seconds: float
    note: str = ""
    failures: list[dict[str, str]] = field(default_factory=list)  # {"test": ..., "traceback": ...}
    report: str = ""


def pytest_step(key: str, name: str, files: tuple[str, ...], device: str, scratch: Path, timeout_s: float) -> Step:
    """The files' tests with the service's packages blocked: the `gpu`-marked ones on CUDA, the rest on a CPU."""
    junit = scratch / f"{key}.xml"
    marker = "gpu" if device == "cuda" else "not gpu and not slow"
    command = (
        sys.executable, "-m", "pytest", "-p", "scripts.gpu.imports", "-p", "no:cacheprovider", "-q", "-m", marker,
        f"--junitxml={junit}", *files,
    )  # fmt: skip
    return Step(key, name, command, timeout_s, junit_path=junit)


def check_steps(device: str, out_dir: Path, scratch: Path, model_dir: Path) -> list[Step]:
    python = sys.executable
    on_cuda = device == "cuda"
    engine_bench = ["--size", "1b"] if on_cuda else ["--size", "tiny", "--dtype", "float32", "--batches", "1,2"]
    engine_bench += [] if on_cuda else ["--output-len", "4", "--prompt-len", "4", "8", "--poisson-requests", "3"]
    # on a CPU the step is the check's smoke run: HF's server as a peer has its own test (tests/bench/service)
    service_bench = ["--num-requests", "64", "--rounds", "2"] if on_cuda else ["--num-requests", "4", "--rounds", "1"]
    service_bench += [] if on_cuda else ["--no-peer"]
    service_bench += ["--output-len", "128" if on_cuda else "4", "--model", str(model_dir)]
    lone_stream = ["--num-requests", "1", "--rounds", "8", "--output-len", "128", "--model", str(model_dir)]
    return [
        pytest_step("a", "gpu tests: kernels, attention backends, greedy == HF, one wait a step", KERNEL_TEST_FILES,
                    device, scratch, 300),
        pytest_step("b", "every model family against HF generate", FAMILY_TEST_FILES[device], device, scratch, 300),
        pytest_step("c", "CUDA graphs with steering and monitoring == eager", GRAPH_TEST_FILES, device, scratch, 240),
        Step("e", "the service on this device: openai client chat, stream, tool call, structured output, batch",
             (python, "-m", "scripts.gpu.service_check", "--device", device, "--model", str(model_dir),
              "--out", str(out_dir / "service.md")), 300, report_path=out_dir / "service.md"),
        Step("f", "engine against HF: bench/gpu.py",
             (python, "-m", ENGINE_BENCH_MODULE, "--device", device, *engine_bench,
              "--out", str(out_dir / "engine.md")),
             420, report_path=out_dir / "engine.md"),
        service_streams_step("the service against the engine in process: bench/service/service_streams.py",
                             out_dir / "streams.md", service_bench, device, 300),
        # one stream at a time: how far the service's first token comes after the engine's, where the engine's own is
        # a few milliseconds (on a CPU the bench's own tests run this path)
        *([service_streams_step("a lone stream through the service against the engine in process",
                                out_dir / "streams-1.md", lone_stream, device, 180)] if on_cuda else []),
    ]  # fmt: skip


def service_streams_step(name: str, report: Path, args: list[str], device: str, timeout_s: float) -> Step:
    command = (sys.executable, "-m", "bench.service.service_streams", "--out", str(report), *args)
    return Step("f", name, command, timeout_s, env={"DEVICE": device}, report_path=report)


def junit_failures(path: Path) -> list[dict[str, str]]:
    """Each failed or erroring test case of a JUnit XML file, with pytest's traceback text."""
    if not path.exists():
        return []
    failures = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        for problem in (*case.findall("failure"), *case.findall("error")):
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            failures.append({"test": test, "traceback": problem.text or problem.get("message", "")})
    return failures


def run_step(step: Step, log_path: Path) -> StepResult:
    """Runs the step with its output passed through and kept in `log_path` (its tail is the traceback of a failing
    step that is not pytest's); a step still running at its time limit is killed."""
    print(f"\n== ({step.key}) {step.name}: {' '.join(step.command)}", flush=True)
    started = time.perf_counter()
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            step.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **step.env}
        ) as process,
    ):
        watchdog = threading.Timer(step.timeout_s, process.kill)
        watchdog.start()
        try:
            for line in process.stdout:  # type: ignore[union-attr]
                sys.stdout.write(line)
                log.write(line)
            process.wait()
        finally:
            watchdog.cancel()
    return collect_result(step, process.returncode, time.perf_counter() - started, log_path)


def collect_result(step: Step, returncode: int | None, seconds: float, log_path: Path) -> StepResult:
    timed_out = seconds >= step.timeout_s
    passed = returncode == 0 and not timed_out
    note = f"stopped after {step.timeout_s:.0f} s" if timed_out else ("" if passed else f"exit status {returncode}")
    failures = junit_failures(step.junit_path) if step.junit_path is not None else []
    if not passed and not failures:
        tail = log_path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
        failures = [{"test": step.name, "traceback": "\n".join(tail)}]
    report = step.report_path.read_text() if step.report_path is not None and step.report_path.exists() else ""
    return StepResult(step.key, step.name, passed, seconds, note, failures, report)
