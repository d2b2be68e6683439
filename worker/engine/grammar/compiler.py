"""Grammars compiled off the engine thread, each at most once: a cache of compilations by spec hash (a hit runs no
compile, a failure is remembered too), a time limit on waiting for one, and the tokenizer read once. Each compile
thread compiles in a process of its own (compile_process.py), killed when a compile's waiters give up on it, so a
refused grammar stops costing CPU at once."""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from transformers import PreTrainedTokenizerFast

from tasks.messages.grammar import GrammarSpec
from worker.engine.grammar.compile_process import CompileKilled, CompileProcess
from worker.engine.interface import RequestFieldError

if TYPE_CHECKING:  # xgrammar loads with the first grammar: a worker (or the GPU check) without one never needs it
    import xgrammar as xgr

XGRAMMAR_LOG_PREFIX = re.compile(r"^\[[^\]]*\] \S+:\d+: ")  # "[16:39:53] /project/cpp/x.cc:83: " of its errors
NUM_COMPILE_THREADS = 2  # a pathological grammar holds one; the other keeps compiling the rest
# Starting a compile process (a forkserver importing xgrammar, the tokenizer read) is the worker's cost, not the
# grammar's: it is not counted against the time limit, up to this long.
MAX_PROCESS_START_S = 120.0


class GrammarError(RequestFieldError):
    """The request's grammar does not compile, or not in time: the client's to fix."""


@dataclass
class Compilation:
    """One spec's compile: its future, and the process running it once one does."""

    spec: GrammarSpec
    future: Future[xgr.CompiledGrammar] = field(default_factory=Future)
    process: CompileProcess | None = None
    is_abandoned: bool = False  # its waiters gave up: it must not start, or it is killed
    process_start_s: float = 0.0  # spent starting a compile process for it, which the time limit does not count
    process_starting_since: float | None = None  # monotonic time, while one is being started

    def uncounted_s(self) -> float:
        """Seconds of process start so far, finished or under way, capped at MAX_PROCESS_START_S."""
        starting_since = self.process_starting_since
        ongoing = 0.0 if starting_since is None else time.monotonic() - starting_since
        return min(self.process_start_s + ongoing, MAX_PROCESS_START_S)


class GrammarCompiler:
    """`compile` may be called from any thread but the engine's: it blocks until the grammar is compiled."""

    def __init__(
        self, tokenizer_path: str, vocab_size: int, stop_token_ids: frozenset[int], timeout_s: float, cache_size: int
    ) -> None:
        self._tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size  # the model's logits width, which may exceed the tokenizer's vocabulary
        self._stop_token_ids = sorted(stop_token_ids)
        self._timeout_s = timeout_s
        self._cache_size = cache_size
        self._compilations: OrderedDict[str, Compilation] = OrderedDict()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(NUM_COMPILE_THREADS, thread_name_prefix="grammar-compile")
        self._tokenizer_info: xgr.TokenizerInfo | None = None  # built with the first grammar
        self._processes: dict[str, CompileProcess] = {}  # by compile thread's name: at most one each
        self.num_compiles = 0

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        """Raises GrammarError (with the spec's param) for a grammar that fails, matches no text or outlasts the time
        limit; a compile that outlasts it is stopped (its waiters all get the error), and a later request for the
        same spec compiles it again."""
        compilation = self._compilation(spec)
        try:
            return self._result_in_time(compilation)
        except FutureTimeout:
            self._abandon(compilation)
            raise self._timed_out(spec) from None
        except (RuntimeError, ValueError) as exc:
            reason = XGRAMMAR_LOG_PREFIX.sub("", str(exc).strip())
            raise GrammarError(f"{spec.param} does not compile: {reason}", spec.param) from exc

    def compile_for(self, spec: GrammarSpec | None) -> tuple[xgr.CompiledGrammar | None, GrammarError | None]:
        """A request's grammar, or why it has none it can run with."""
        if spec is None:
            return None, None
        try:
            return self.compile(spec), None
        except GrammarError as exc:
            return None, exc

    def _result_in_time(self, compilation: Compilation) -> xgr.CompiledGrammar:
        """The compilation's result within the time limit plus the time a process start took for it (a worker's
        first grammars, or one after a killed compile, wait for a fresh process, which on a loaded machine can take
        longer than the limit itself); raises FutureTimeout past that."""
        started_at = time.monotonic()
        while True:
            deadline = started_at + self._timeout_s + compilation.uncounted_s()
            try:
                return compilation.future.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                if started_at + self._timeout_s + compilation.uncounted_s() <= time.monotonic():
                    raise

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            processes = list(self._processes.values())
        for process in processes:
            process.kill()

    def _timed_out(self, spec: GrammarSpec) -> GrammarError:
        message = f"{spec.param}: the grammar did not compile within {self._timeout_s:g}s; simplify it"
        return GrammarError(message, spec.param)

    def _abandon(self, compilation: Compilation) -> None:
        """Nobody waits on this compile any more: it leaves the cache (a later request compiles it again, perhaps on
        a quieter worker), and stops, queued or running."""
        with self._lock:
            if self._compilations.get(compilation.spec.key) is compilation:
                del self._compilations[compilation.spec.key]
            compilation.is_abandoned = True
            process = compilation.process
        if process is not None:
            process.kill()

    def _compilation(self, spec: GrammarSpec) -> Compilation:
        with self._lock:
            compilation = self._compilations.get(spec.key)
            if compilation is not None:
                self._compilations.move_to_end(spec.key)
                return compilation
            compilation = Compilation(spec)
            self._compilations[spec.key] = compilation
            if len(self._compilations) > self._cache_size:
                self._compilations.popitem(last=False)
            self.num_compiles += 1
        self._executor.submit(self._run, compilation)
        return compilation

    def _run(self, compilation: Compilation) -> None:
        """On a compile thread: the compilation's result or error into its future."""
        try:
            compilation.future.set_result(self._compile(compilation))
        except Exception as exc:
            compilation.future.set_exception(exc)

    def _compile(self, compilation: Compilation) -> xgr.CompiledGrammar:
        import xgrammar as xgr

        from worker.engine.grammar.sources import can_start

        spec = compilation.spec
        compilation.process_starting_since = time.monotonic()
        try:
            process = self._process()
        finally:
            compilation.process_start_s += time.monotonic() - compilation.process_starting_since
            compilation.process_starting_since = None
        with self._lock:
            if compilation.is_abandoned:
                raise self._timed_out(spec)
            compilation.process = process
        try:
            compiled_json = process.compile(spec)
        except CompileKilled:
            raise self._timed_out(spec) from None
        compiled = xgr.CompiledGrammar.deserialize_json(compiled_json, self._tokenizer_info)
        if not can_start(compiled):
            raise GrammarError(f"{spec.param} can never be matched: no text satisfies it", spec.param)
        return compiled

    def _process(self) -> CompileProcess:
        """This compile thread's process, started anew when it has none or its last one was killed."""
        thread = threading.current_thread().name
        with self._lock:
            if self._tokenizer_info is None:
                self._tokenizer_info = self._new_tokenizer_info()
            process = self._processes.get(thread)
        if process is None or not process.is_alive():
            process = CompileProcess(self._tokenizer_info.serialize_json())
            with self._lock:
                self._processes[thread] = process
        return process

    def _new_tokenizer_info(self) -> xgr.TokenizerInfo:
        import xgrammar as xgr

        tokenizer = PreTrainedTokenizerFast.from_pretrained(self._tokenizer_path)
        return xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop_token_ids
        )
