"""The C kernels beside this file, built with the system C compiler once per machine and cached: a library's name
changes with its source, its flags, the compiler and this CPU, so -march=native code is never loaded on another
CPU from a shared cache."""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

# -fassociative-math lets the compiler vectorize the sums; no -ffast-math, whose shared objects switch the whole
# process to flushing denormals to zero when loaded.
CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math")
COMPILE_TIMEOUT_S = 120


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "steerbatch" / "kernels"


def built_library(source: Path, flags: tuple[str, ...], cache_dir: Path | None = None) -> Path:
    """The shared library of `source` compiled with `flags`, compiled first if this machine has none yet; raises
    OSError or SubprocessError when it cannot be built."""
    cache_dir = cache_dir or default_cache_dir()
    library = cache_dir / f"{source.stem}-{_build_key(source, flags)}.so"
    if not library.exists():
        _compile(source, flags, library)
    return library


def _compile(source: Path, flags: tuple[str, ...], library: Path) -> None:
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        raise OSError("no C compiler: set CC or install gcc")
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:  # os.replace: concurrent builders never clash
        built = Path(scratch) / library.name
        command = [compiler, *flags, "-shared", "-fPIC", str(source), "-o", str(built)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            raise OSError(f"{' '.join(command)} failed: {done.stderr.strip()[:500]}")
        os.replace(built, library)
    logger.info("compiled %s into %s", source.name, library)


def _build_key(source: Path, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256(source.read_bytes())
    digest.update(" ".join(flags).encode())
    digest.update(f"{platform.machine()} {_cpu_identity()} {os.environ.get('CC', 'cc')}".encode())
    return digest.hexdigest()[:16]


def _cpu_identity() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags", "CPU part", "Features")  # x86, and ARM's names
    return "|".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))
