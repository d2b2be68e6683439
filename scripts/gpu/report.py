"""The GPU check's report: the machine (device, driver, versions), the commit, each step's outcome, every failure
with its traceback, and the tables the benchmarks wrote; as report.json and report.md in the folder the call brings
back."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path

from scripts.gpu.bundle import source_commit as git_commit
from scripts.gpu.steps import StepResult

VERSIONED_PACKAGES = ("torch", "transformers", "triton", "flash-attn", "xgrammar", "celery", "flask", "sqlalchemy")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def device_facts(device: str) -> dict[str, object]:
    import torch

    if device != "cuda":
        return {"name": platform.processor() or platform.machine(), "cuda": None, "driver": None}
    properties = torch.cuda.get_device_properties(0)
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        driver = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown (nvidia-smi did not answer)"
    return {
        "name": properties.name,
        "memory_gib": round(properties.total_memory / 2**30, 1),
        "multiprocessors": properties.multi_processor_count,
        "capability": f"{properties.major}.{properties.minor}",
        "cuda": torch.version.cuda,
        "driver": driver,
    }


def source_commit(bundle: Path | None) -> dict[str, object]:
    """The commit of the tree under check: git's where the tree is a checkout, else the bundle's manifest's (the GPU
    machine gets the tree without .git; `make gpu-bundle` records the commit it was made at)."""
    checkout = git_commit()
    if checkout["commit"] != "unknown":
        return {**checkout, "from": "git"}
    if bundle is not None and (bundle / "manifest.json").exists():
        manifest = json.loads((bundle / "manifest.json").read_text())
        return {"commit": manifest["commit"], "dirty": manifest.get("dirty"), "from": "the bundle's manifest"}
    return {"commit": "unknown", "from": "no git and no bundle"}


def build_report(steps: list[StepResult], skipped: dict[str, str], facts: dict) -> dict[str, object]:
    return {
        "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **facts,
        "passed": all(step.passed for step in steps),
        "steps": [dataclasses.asdict(step) for step in steps],
        "not_run": skipped,
    }


def markdown(report: dict) -> str:
    device, versions, source = report["device"], report["versions"], report["source"]
    lines = [
        f"# GPU check: {'passed' if report['passed'] else 'FAILED'}",
        "",
        f"Device: {device['name']}" + (f", {device.get('memory_gib')} GiB, CUDA {device['cuda']}, driver "
                                       f"{device['driver']}" if device.get("cuda") else " (CPU run)"),
        "Versions: " + ", ".join(f"{name} {version}" for name, version in versions.items()),
        f"Commit: {source['commit']} ({source['from']}" + (", with uncommitted changes" if source.get("dirty") else "")
        + f"); finished {report['finished_at']}",
        "",
        "| step | what | result | seconds |",
        "|---|---|---|---:|",
    ]  # fmt: skip
    for step in report["steps"]:
        result = "passed" if step["passed"] else f"FAILED {step['note']}".rstrip()
        lines.append(f"| ({step['key']}) | {step['name']} | {result} | {step['seconds']:.0f} |")
    lines += [f"| ({key}) | {why} | not run | |" for key, why in report["not_run"].items()]
    failures = [(step["key"], failure) for step in report["steps"] for failure in step["failures"]]
    if failures:
        lines += ["", "## Failures"]
        for key, failure in failures:
            lines += ["", f"### ({key}) {failure['test']}", "", "```", failure["traceback"].rstrip(), "```"]
    for step in report["steps"]:
        if step["report"]:
            lines += ["", f"## ({step['key']}) {step['name']}", "", step["report"].rstrip()]
    return "\n".join(lines) + "\n"


def write_report(report: dict, out_dir: Path) -> None:
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "report.md").write_text(markdown(report))
