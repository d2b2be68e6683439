"""A grammar compile in a process of its own. xgrammar's compile cannot be interrupted inside a thread, so a compile
that outlasts its time limit would keep a core busy long after its request was refused; a process is killed instead.

Processes fork from a forkserver that has imported xgrammar once (a fresh interpreter takes seconds to import it and
torch); each builds its compiler from the parent's tokenizer info and compiles one spec at a time. Specs go in and
compiled grammars come back as JSON over a pipe."""

from __future__ import annotations

import json
import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

from tasks.messages.grammar import GrammarSpec

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["xgrammar", "worker.engine.grammar.sources"])


class CompileKilled(Exception):
    """The process died before it answered: killed for its time limit, or crashed."""


class CompileProcess:
    def __init__(self, tokenizer_info_json: str) -> None:
        self._conn, child_conn = CONTEXT.Pipe()
        self._process = CONTEXT.Process(
            target=serve_compiles, args=(child_conn, tokenizer_info_json), name="grammar-compile", daemon=True
        )
        self._process.start()
        child_conn.close()

    def compile(self, spec: GrammarSpec) -> str:
        """The compiled grammar as xgrammar's JSON; raises ValueError with xgrammar's message for a grammar that does
        not compile, CompileKilled if the process dies first."""
        try:
            self._conn.send_bytes(json.dumps(spec.to_dict()).encode())
            reply: dict[str, Any] = json.loads(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            self._process.join()
            self._conn.close()
            raise CompileKilled(str(exc)) from exc
        if "error" in reply:
            raise ValueError(reply["error"])
        return reply["compiled"]

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def kill(self) -> None:
        """From any thread: the thread in `compile`, if any, gets CompileKilled and closes the pipe (closing it here
        could close a descriptor that thread is reading, or by then another file's)."""
        self._process.kill()


def serve_compiles(conn: Connection, tokenizer_info_json: str) -> None:
    """The process's loop: a spec in, its compiled grammar (or xgrammar's error) out, until the pipe closes."""
    import xgrammar as xgr

    from worker.engine.grammar.sources import compile_spec

    info = xgr.TokenizerInfo.deserialize_json(tokenizer_info_json)
    # xgrammar's own cache is off: the parent's, by spec hash, already runs each compile once
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    while True:
        try:
            spec = GrammarSpec.from_dict(json.loads(conn.recv_bytes()))
        except EOFError:
            return
        try:
            reply = {"compiled": compile_spec(compiler, spec).serialize_json()}
        except (RuntimeError, ValueError) as exc:
            reply = {"error": str(exc)}
        conn.send_bytes(json.dumps(reply).encode())
