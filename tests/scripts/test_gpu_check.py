"""The GPU check's CPU-side guarantees: everything it runs imports, and its gpu tests collect, with the service's
packages unimportable (as on a GPU machine that lacks them), and it refuses a machine without CUDA plainly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from scripts.gpu import check as gpu_check
from scripts.gpu import steps as gpu_steps
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
