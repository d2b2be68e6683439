"""The GPU check (`make gpu-check`, scripts/gpu/check.sh): on a CUDA machine with no network, from the source tree
and the folder `make gpu-bundle` wrote (the service's wheels and the tiny model), everything this product runs on a
GPU, in one sequence, with one report (report.md and report.json in --out-dir):

  (a) the gpu tests: Triton kernels, every attention backend against HF's, greedy == HF `generate` in float32 and
      bfloat16, one device wait per step; (c) CUDA-graph steps, steering and monitoring in them, == eager steps;
  (e) the whole stack on the device (gunicorn, a Celery worker, embedded Redis, SQLite) serving the `openai` client;
  (f) bench/gpu.py's engine table and the service's streams against the engine in process.

    PYTHONPATH=. python3 -m scripts.gpu.check --device cuda --bundle gpu-bundle --out-dir gpu-check [--steps a,c]

With `--device cpu` the same sequence runs on a CPU at the smallest sizes (Triton under its interpreter, graph steps
replayed eagerly), which is how CI knows the check works before it meets a GPU. The engine's steps need only torch,
transformers, triton and pytest (the service's packages stay blocked: scripts/gpu/imports.py); the service's come
from the bundle.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

from scripts.gpu import report as reports
from scripts.gpu.steps import (
    ENGINE_BENCH_MODULE,
    GPU_TEST_FILES,
    NOT_YET_SERVED,
    Step,
    StepResult,
    check_steps,
    run_step,
)
from tasks.config import REPO_ROOT

MIN_VERSIONS = {"torch": (2, 6), "transformers": (5, 0)}
TINY_MODEL_VARIABLE = "STEERBATCH_TINY_MODEL"  # tests/conftest.py takes a prebuilt tiny model from here


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("+")[0].split(".")[:2] if part.isdigit())


def environment_problems(device: str) -> list[str]:
    """What keeps this machine from running the check; empty when nothing does."""
    problems = []  # Python 3.10+: scripts/gpu/check.sh checks it before this file's syntax needs it
    for package, least in MIN_VERSIONS.items():
        if importlib.util.find_spec(package) is None:
            problems.append(f"{package} is not installed")
            continue
        version = importlib.import_module(package).__version__
        if version_tuple(version) < least:
            problems.append(f"{package} {version}: {'.'.join(map(str, least))} or later is needed")
    for package, why in (("triton", "CUDA builds of torch ship it"), ("pytest", "carry its wheel with the bundle")):
        if importlib.util.find_spec(package) is None:
            problems.append(f"{package} is not installed ({why})")
    if not problems and device == "cuda":
        import torch

        if not torch.cuda.is_available():
            problems.append(f"torch {torch.__version__} sees no CUDA device")
    return problems


def test_modules() -> list[str]:
    return [path.removesuffix(".py").replace("/", ".") for path in GPU_TEST_FILES]


def imports_step() -> Step:
    modules = ["tests.conftest", "tests.worker.conftest", *test_modules(), ENGINE_BENCH_MODULE]
    return Step("a", "what the engine's steps import, without the service's packages",
                (sys.executable, "-m", "scripts.gpu.imports", *modules), 120)  # fmt: skip


def tiny_model(bundle: Path | None) -> Path:
    """The bundle's tiny model where there is one (built here, so the GPU machine does not train its own), else the
    checkout's, which tests/conftest.py builds when it is missing."""
    if bundle is not None and (bundle / "models" / "tiny" / "config.json").exists():
        return bundle / "models" / "tiny"
    return REPO_ROOT / "models" / "tiny"


def run_checks(args: argparse.Namespace, out_dir: Path, scratch: Path) -> list[StepResult]:
    model_dir = tiny_model(args.bundle)
    os.environ[TINY_MODEL_VARIABLE] = str(model_dir)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # read by Triton as the steps' processes import it
    steps = [imports_step(), *check_steps(args.device, out_dir, scratch, model_dir)]
    chosen = [step for step in steps if args.steps is None or step.key in args.steps]
    return [run_step(step, scratch / f"step-{index}.log") for index, step in enumerate(chosen)]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out-dir", type=Path, default=Path("gpu-check"), help="report.md, report.json, tables")
    parser.add_argument("--bundle", type=Path, help="the folder `make gpu-bundle` wrote")
    parser.add_argument("--steps", type=lambda text: set(text.split(",")), help="only these letters, e.g. a,c")
    args = parser.parse_args(argv)
    args.bundle = args.bundle.resolve() if args.bundle is not None and args.bundle.exists() else None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problems = environment_problems(args.device)
    if problems:
        print("the GPU check cannot run here:\n" + "\n".join(f"- {problem}" for problem in problems))
        return 2
    out_dir = args.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as scratch:
        results = run_checks(args, out_dir, Path(scratch))
    facts = {
        "device": reports.device_facts(args.device),
        "versions": reports.package_versions(),
        "source": reports.source_commit(args.bundle),
    }
    not_run = {key: why for key, why in NOT_YET_SERVED.items() if args.steps is None or key in args.steps}
    report = reports.build_report(results, not_run, facts)
    reports.write_report(report, out_dir)
    print(f"\nGPU check ({args.device}), {time.perf_counter() - started:.0f} s in all; report in {out_dir}/report.md")
    for result in results:
        outcome = "passed" if result.passed else f"FAILED {result.note}".rstrip()
        print(f"- ({result.key}) {result.name}: {outcome} in {result.seconds:.0f} s")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
