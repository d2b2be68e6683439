"""Grammars compiled off the engine thread, each at most once: a cache of compilations by spec hash (a hit runs no
compile, a failure is remembered too), a time limit on waiting for one, and the tokenizer read once."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

from transformers import PreTrainedTokenizerFast

from tasks.messages.grammar import GrammarSpec

if TYPE_CHECKING:  # xgrammar loads with the first grammar: a worker (or the GPU check) without one never needs it
    import xgrammar as xgr

XGRAMMAR_LOG_PREFIX = re.compile(r"^\[[^\]]*\] \S+:\d+: ")  # "[16:39:53] /project/cpp/x.cc:83: " of its errors
NUM_COMPILE_THREADS = 2  # a pathological grammar holds one; the other keeps compiling the rest


class GrammarError(Exception):
    """The request's grammar does not compile, or not in time: the client's to fix."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


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
        self._compilations: OrderedDict[str, Future[xgr.CompiledGrammar]] = OrderedDict()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(NUM_COMPILE_THREADS, thread_name_prefix="grammar-compile")
        self._compiler: xgr.GrammarCompiler | None = None  # built with the first grammar
        self.num_compiles = 0

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        """Raises GrammarError (with the spec's param) for a grammar that fails, matches no text or outlasts the time
        limit; an abandoned compile finishes in its thread, and a later request for the same spec waits on it."""
        compilation = self._compilation(spec)
        try:
            return compilation.result(timeout=self._timeout_s)
        except FutureTimeout:
            message = f"{spec.param}: the grammar did not compile within {self._timeout_s:g}s; simplify it"
            raise GrammarError(message, spec.param) from None
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

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _compilation(self, spec: GrammarSpec) -> Future[xgr.CompiledGrammar]:
        with self._lock:
            compilation = self._compilations.get(spec.key)
            if compilation is not None:
                self._compilations.move_to_end(spec.key)
                return compilation
            compilation = self._executor.submit(self._compile, spec)
            self._compilations[spec.key] = compilation
            if len(self._compilations) > self._cache_size:
                self._compilations.popitem(last=False)
            self.num_compiles += 1
            return compilation

    def _compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        with self._lock:
            if self._compiler is None:
                self._compiler = self._new_compiler()
            compiler = self._compiler
        from worker.engine.grammar.sources import can_start, compile_spec  # imports xgrammar

        compiled = compile_spec(compiler, spec)
        if not can_start(compiled):
            raise GrammarError(f"{spec.param} can never be matched: no text satisfies it", spec.param)
        return compiled

    def _new_compiler(self) -> xgr.GrammarCompiler:
        import xgrammar as xgr

        tokenizer = PreTrainedTokenizerFast.from_pretrained(self._tokenizer_path)
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop_token_ids
        )
        # xgrammar's own cache is off: ours, by spec hash, already runs each compile once
        return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
