"""The OpenMP runtime torch's CPU operators and our C kernels share (GNU libgomp), and the one request the engine
makes of it: that a thread done with its parallel regions hands its worker threads back.

Why: libgomp keeps, for every thread that has run a parallel region, a team of worker threads that wait for that
thread's next region. A waiting worker spins (and wakes at once) only while libgomp manages no more threads than the
process may run on; past that, every worker sleeps in the kernel, and each parallel region first wakes its team, which
on a 2-core virtual machine took about 100 us (an idle vCPU's wake-up). The thread that loads the model keeps such a
team; then the engine thread's team sleeps between regions, and a one-request decode step of the 135M model over the
int8 kernel's 210 linears (a region each) took 54 ms on the engine thread against 25 ms on the thread that loaded it
(docs/BENCHMARKS.md, quantization). Releasing the loading thread's team leaves the engine's the only one.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

# omp_pause_resource_t's omp_pause_soft (OpenMP 5.0): the calling thread's idle workers end; a later region starts new
_OMP_PAUSE_SOFT = 1


def release_thread_pool() -> bool:
    """Ends the calling thread's idle OpenMP worker threads (its next parallel region, if any, starts a new team);
    False where the process has no libgomp with `omp_pause_resource_all` (another OpenMP runtime: nothing to do).
    A few microseconds once the function is found: cheap enough to call wherever a thread may have run torch."""
    pause = _pause_function()
    return pause is not None and pause(_OMP_PAUSE_SOFT) == 0


@functools.cache
def _pause_function() -> Callable[[int], int] | None:
    """libgomp's omp_pause_resource_all, looked up once (torch, and with it libgomp, is loaded before any call)."""
    library = _loaded_libgomp()
    try:
        pause = ctypes.CDLL(library).omp_pause_resource_all if library else None
    except (OSError, AttributeError):
        pause = None
    if pause is None:
        logger.debug("no libgomp with omp_pause_resource_all in this process")
        return None
    pause.argtypes = [ctypes.c_int]
    pause.restype = ctypes.c_int
    return pause


def _loaded_libgomp() -> str | None:
    """The path of the libgomp this process has loaded (torch's, whatever a wheel renamed it to), so that the call
    reaches the runtime torch's threads run on and never loads a second one; None where none is loaded or there is no
    /proc (not Linux)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    for line in maps.read_text().splitlines():
        path = line.split(maxsplit=5)[-1]
        if "libgomp" in Path(path).name:
            return path
    return None
