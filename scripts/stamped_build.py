"""Builds an output folder at most once per build hash: a stamp in the folder records the hash it was built from, a
file lock makes a second concurrent builder wait and then find the first one's result, and the folder is filled in
a temporary directory and swapped into place whole, so no reader ever sees half a build. Stdlib only."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

STAMP_NAME = "build_stamp.json"


def is_up_to_date(out: Path, build_hash: str, required_files: tuple[str, ...]) -> bool:
    if not all((out / name).is_file() for name in (*required_files, STAMP_NAME)):
        return False
    try:
        return json.loads((out / STAMP_NAME).read_text()).get("build_hash") == build_hash
    except (OSError, ValueError):
        return False


def build_once(
    out: Path,
    build_hash: str,
    required_files: tuple[str, ...],
    fill: Callable[[Path], dict[str, Any]],
    log: logging.Logger,
    force: bool = False,
) -> None:
    """Runs `fill(folder)` (which returns extra stamp fields) unless `out` already holds this build."""
    if not force and is_up_to_date(out, build_hash, required_files):
        log.info("%s is up to date", out)
        return
    with build_lock(out):
        if not force and is_up_to_date(out, build_hash, required_files):
            log.info("%s is up to date (another process just built it)", out)
            return
        _build(out, build_hash, fill, log)


def _build(out: Path, build_hash: str, fill: Callable[[Path], dict[str, Any]], log: logging.Logger) -> None:
    # A plain SIGTERM would skip the cleanup below and leave the temp folder behind.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.building-"))
    try:
        stamp = {"build_hash": build_hash, "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat()}
        stamp |= fill(folder)
        (folder / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")
        replace_folder(folder, out)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    log.info("built %s in %.1fs", out, time.monotonic() - started)


def replace_folder(built: Path, out: Path) -> None:
    """Swap the finished build into place; the old folder is removed only after the rename."""
    # mkdtemp and the safetensors writer create owner-only modes; workers may run as another user.
    built.chmod(0o755)
    for path in built.iterdir():
        path.chmod(0o644)
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        out.rename(old / out.name)
    built.rename(out)
    if old is not None:
        shutil.rmtree(old)


@contextlib.contextmanager
def build_lock(out: Path) -> Iterator[None]:
    """Serialises builds of one folder."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
