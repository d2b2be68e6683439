"""The one-command GPU check (scripts/gpu_check.sh, `make gpu-check`), for any CUDA machine with no network and only
what is installed there: Python 3.10+, a CUDA build of torch 2.6+, transformers 5+, triton, pytest. Celery, Redis,
Flask, SQLAlchemy and the rest of the service are not needed and stay unimportable throughout (scripts/gpu_imports.py);
the source tree runs as it is, on PYTHONPATH.

    PYTHONPATH=. python3 -m scripts.gpu_check --out gpu-check.md

1. the environment: versions, a CUDA device; 2. everything the next steps import, with the service's packages
blocked; 3. the `gpu`-marked tests of GPU_TEST_FILES (greedy == HF generate in float32 and bfloat16, each attention
backend against HF's SDPA, CUDA-graph steps == eager steps, steering in graphs == eager steering, one device wait per
step); 4. bench/gpu.py, whose report goes to --out. Its summary table prints last, then what each step gave.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

GPU_TEST_FILES = (
    "tests/worker/kernels/test_triton_attention.py",
    "tests/worker/engine/test_paged_attention_gpu.py",
    "tests/worker/engine/test_greedy_dtypes.py",
    "tests/worker/engine/test_decode_graphs.py",
    "tests/worker/engine/test_host_syncs.py",
)
BENCH_MODULE = "bench.gpu"
MIN_VERSIONS = {"torch": (2, 6), "transformers": (5, 0)}
TESTS_TIMEOUT_S = 240
BENCH_TIMEOUT_S = 420
NO_PYTEST = (
    "pytest is not installed, so the gpu tests did not run. With no network, carry its wheels (pytest, pluggy, "
    "iniconfig, packaging) from a machine that has one: `pip download --no-deps -d wheels pytest pluggy iniconfig "
    "packaging`, then here `pip install --no-index --no-deps --target /tmp/site wheels/*.whl` and run again with "
    "PYTHONPATH=.:/tmp/site."
)


@dataclass(frozen=True)
class StepResult:
    name: str
    passed: bool
    seconds: float
    note: str = ""


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("+")[0].split(".")[:2] if part.isdigit())


def environment_problems() -> list[str]:
    """What keeps this machine from running the check; empty when nothing does."""
    problems = []  # Python 3.10+: scripts/gpu_check.sh checks it before this file's syntax needs it
    for package, least in MIN_VERSIONS.items():
        if importlib.util.find_spec(package) is None:
            problems.append(f"{package} is not installed")
            continue
        version = importlib.import_module(package).__version__
        if version_tuple(version) < least:
            problems.append(f"{package} {version}: {'.'.join(map(str, least))} or later is needed")
    if importlib.util.find_spec("triton") is None:
        problems.append("triton is not installed (CUDA builds of torch ship it)")
    if not problems:
        import torch

        if not torch.cuda.is_available():
            problems.append(f"torch {torch.__version__} sees no CUDA device")
    return problems


def run_step(name: str, command: list[str], timeout_s: float) -> StepResult:
    """Runs `command` with its output passed through; passed when it exits 0 within `timeout_s`."""
    print(f"\n== {name}: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    try:
        completed = subprocess.run(command, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return StepResult(name, False, time.perf_counter() - started, f"stopped after {timeout_s:.0f} s")
    note = "" if completed.returncode == 0 else f"exit status {completed.returncode}"
    return StepResult(name, completed.returncode == 0, time.perf_counter() - started, note)


def test_modules() -> list[str]:
    return [path.removesuffix(".py").replace("/", ".") for path in GPU_TEST_FILES]


def run_checks(out: Path) -> list[StepResult]:
    python = sys.executable
    imports = [python, "-m", "scripts.gpu_imports", "tests.conftest", "tests.worker.conftest", *test_modules()]
    steps = [run_step("imports without the service's packages", [*imports, BENCH_MODULE], 120)]
    if importlib.util.find_spec("pytest") is None:
        print(NO_PYTEST, flush=True)
        steps.append(StepResult("gpu tests", False, 0.0, "pytest is not installed (see above)"))
    else:
        pytest = [python, "-m", "pytest", "-p", "scripts.gpu_imports", "-p", "no:cacheprovider", "-m", "gpu", "-q"]
        steps.append(run_step("gpu tests", [*pytest, *GPU_TEST_FILES], TESTS_TIMEOUT_S))
    steps.append(run_step("bench/gpu.py", [python, "-m", BENCH_MODULE, "--out", str(out)], BENCH_TIMEOUT_S))
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu-check.md"), help="bench/gpu.py's report goes here")
    args = parser.parse_args(argv)
    problems = environment_problems()
    if problems:
        print("the GPU check cannot run here:\n" + "\n".join(f"- {problem}" for problem in problems))
        return 2
    started = time.perf_counter()
    steps = run_checks(args.out)
    print(f"\nGPU check, {time.perf_counter() - started:.0f} s in all; the bench's report is in {args.out}")
    for step in steps:
        print(f"- {step.name}: {'passed' if step.passed else 'FAILED'} in {step.seconds:.0f} s {step.note}".rstrip())
    return 0 if all(step.passed for step in steps) else 1


if __name__ == "__main__":
    raise SystemExit(main())
