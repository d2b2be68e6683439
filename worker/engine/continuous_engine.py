"""The continuous-batching engine: one thread owns the device and, every step, runs whatever is in flight.

Each step the scheduler picks decodes and prefill chunks within the token budget, the runner computes them in one
forward pass over the paged KV pool, the sampler picks a token for every request that reached its last token, and
the scheduler appends them, finishing and freeing whatever stopped. New requests and cancellations are taken between
steps, so a request joins the batch at the next step and a cancelled one frees its blocks at the next step.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch

from scheduler.batch import Batch
from scheduler.request import Request
from scheduler.scheduler import Scheduler, TokenUpdate
from tasks.config import Config
from tasks.messages.generation import FinishReason, TokenLogprob
from worker.engine.admission import admission_error
from worker.engine.embedding.embedder import Embedder
from worker.engine.embedding.jobs import EmbeddingCallback, EmbeddingJob, EmbeddingRequest
from worker.engine.engine_config import grammar_compiler, scheduler_config, speculation_config
from worker.engine.grammar.matcher import MaskFiller, RowGrammar
from worker.engine.inbox import EngineInbox, NewWork
from worker.engine.interface import EngineOutput, EngineRequest, OutputCallback, RequestFieldError
from worker.engine.model_runner import ModelRunner
from worker.engine.sampling.prompt_logprobs import prompt_logit_rows, score_prompts
from worker.engine.sampling.sampler import SamplingRow
from worker.engine.sampling.step_tokens import StepTokens, pick_tokens
from worker.engine.sequence import EngineSequence, Submission, request_generator, scheduled_request
from worker.engine.speculation.allowance import speculation_allowance
from worker.engine.speculation.draft_models import load_proposers
from worker.engine.speculation.speculator import Allowance, Speculator
from worker.engine.stats import EngineLoad, EngineStats
from worker.kernels.openmp_pool import release_thread_pool
from worker.steering.request_sae import resolve_request_sae, resolve_steering
from worker.steering.worker_monitor import WorkerMonitor

logger = logging.getLogger(__name__)


class ContinuousEngine:
    """Implements `worker.engine.interface.Engine`; `submit`, `cancel`, `set_worker_monitor` and `stop` may be called
    from any thread, everything else runs on the engine thread."""

    def __init__(
        self,
        runner: ModelRunner,
        config: Config,
        step_scope: Callable[[], AbstractContextManager[object]] = nullcontext,
    ) -> None:
        """Each step runs inside `step_scope()` on the engine thread: the engine process sends a step's outputs as the
        step leaves it."""
        self._runner = runner
        self._step_scope = step_scope
        self._config = config
        self._scheduler = Scheduler(scheduler_config(config, runner))
        self._speculator = Speculator(speculation_config(config), runner.max_model_len, load_proposers(config, runner))
        self._grammars = grammar_compiler(config, runner)
        self._masks = MaskFiller(self._grammars.vocab_size)
        self._inbox = EngineInbox()
        self._embedder = Embedder(runner, config.max_num_batched_tokens, config.model)
        self._sequences: dict[str, EngineSequence] = {}
        self._step_monitor: WorkerMonitor | None = None  # the worker monitor as of the last `take_new_work`
        self._stats = EngineStats()
        self._stats_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="continuous-engine", daemon=True)

    # --- any thread ---

    def start(self) -> None:
        # The calling thread loaded the model; its OpenMP team would leave the engine thread's asleep between
        # parallel regions (worker/kernels/openmp_pool.py)
        release_thread_pool()
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float | None = None) -> None:
        """Aborts everything in flight and ends the engine thread."""
        self._inbox.stop()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        else:
            self._abort_all()

    def submit(self, request: EngineRequest, on_output: OutputCallback) -> None:
        """Resolves the request's steering and monitor, and compiles its grammar, on the caller's thread, so an SAE
        loading from disk or a grammar compiling never holds up the batch; a failure comes back as the request's
        error output."""
        try:
            sae, sae_error = resolve_request_sae(request, self._runner.saes, self._config), None
        except RequestFieldError as exc:
            sae, sae_error = None, exc
        grammar, grammar_error = self._grammars.compile_for(request.grammar)
        self._inbox.submit(Submission(request, on_output, sae, sae_error, grammar, grammar_error))

    def submit_embedding(self, request: EmbeddingRequest, on_done: EmbeddingCallback) -> None:
        """Queues an embedding request, its steering resolved here as `submit` resolves a request's; it runs between
        steps, batched with the others waiting, and `on_done` is called once from the engine thread."""
        job = EmbeddingJob(request, None, on_done)
        if request.steering is not None:
            try:
                sae = resolve_steering(request.steering, self._runner.saes, self._config)
            except RequestFieldError as exc:
                job.fail(str(exc), param=exc.param)
                return
            job = EmbeddingJob(request, sae, on_done)
        self._inbox.submit_embedding(job)

    def cancel(self, request_id: str) -> None:
        self._inbox.cancel(request_id)

    def set_worker_monitor(self, monitor: WorkerMonitor | None) -> None:
        """Starts (or, with None, stops) the worker-wide monitor from the next step on."""
        self._inbox.set_worker_monitor(monitor)

    @property
    def stats(self) -> EngineStats:
        with self._stats_lock:
            return self._stats.snapshot()

    @property
    def num_free_blocks(self) -> int:
        return self._scheduler.block_manager.num_free_blocks

    @property
    def num_blocks(self) -> int:
        return self._scheduler.block_manager.num_blocks

    @property
    def block_size(self) -> int:
        return self._scheduler.block_manager.block_size

    def load(self) -> EngineLoad:
        """The batch, the waiting requests and the KV pool as of now, read from another thread without a lock: the
        engine thread never waits for it (copying a list, reading a length or an int is atomic in CPython)."""
        waiting = Counter(request.priority for request in list(self._scheduler.waiting))
        running = len(self._scheduler.running)
        return EngineLoad(running, dict(waiting), self.num_free_blocks, self.num_blocks)

    # --- the engine thread ---

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while self.take_new_work():
                    if self._scheduler.has_work:
                        self.step()
        finally:
            self._inbox.stop()  # whatever ended the loop, later submissions are refused rather than never answered
            self._abort_all()
            self._grammars.close()
            self._masks.close()

    def take_new_work(self) -> bool:
        """Admits submissions and applies cancellations; False when the engine is stopping."""
        new_work = self._inbox.take(lambda: self._scheduler.has_work)
        if new_work is None:
            return False
        self._apply(new_work)
        return True

    def step(self) -> None:
        """One engine step: schedule, run the forward pass and pick tokens, then append, stop and stream them."""
        with self._step_scope():
            batch = self._schedule()
            try:
                self._speculator.fill_proposals(batch)
                started = time.perf_counter()
                picked = self._run_batch(batch)
                self._postprocess(batch, picked)
                self._speculator.record_step(batch, time.perf_counter() - started)
            except Exception as exc:
                logger.exception("an engine step over %d requests failed", len(batch.chunks))
                for chunk in batch.chunks:  # finished in this step or not, each still owes its caller an output
                    self._fail(chunk.request.request_id, f"the engine step failed: {exc}")

    def _schedule(self) -> Batch:
        self._speculator.propose(self._scheduler.running, self._speculation_allowance)
        return self._scheduler.schedule()

    def _run_batch(self, batch: Batch) -> StepTokens:
        rows = [self._sequences[chunk.request.request_id].sae for chunk in batch.chunks]
        grammars = [self._sequences[chunk.request.request_id].grammar for chunk in batch.sampling_chunks]
        bitmasks = self._masks.start([grammar for grammar in grammars if grammar is not None])
        prompt_rows = prompt_logit_rows(batch.chunks, self._sequences)
        output = self._runner.run(batch, rows, self._step_monitor, prompt_rows.indices)
        for request_id, positions in output.monitored.items():
            self._sequences[request_id].monitored.extend(positions)
        prompt_scores = score_prompts(output.prompt_logits, prompt_rows, self._sequences)
        picked = pick_tokens(batch.sampling_chunks, output.logits, self._sampling_row, self._runner.argmax, bitmasks)
        if prompt_scores is not None:
            prompt_scores.collect(self._sequences)
        return picked

    def _postprocess(self, batch: Batch, picked: StepTokens) -> None:
        if picked.failed or picked.dead_ends:
            batch, picked = self._drop_failed_rows(batch, picked)
        updates = self._scheduler.update_from_output(batch, picked.token_ids)
        self._record_verifications(picked, {update.request.request_id: len(update.token_ids) for update in updates})
        self._record_step(batch)
        for update, logprob in zip(updates, picked.logprobs, strict=True):
            if self._hand_to_grammar(update):
                self._emit(update, logprob)

    def _drop_failed_rows(self, batch: Batch, picked: StepTokens) -> tuple[Batch, StepTokens]:
        """Ends each request whose row could not be sampled (the engine's failure) or whose grammar dead-ended (the
        request's own error, naming its grammar's field), and the step without them: the others go on as if those
        rows had never been in it."""
        for request_id, error in picked.failed.items():
            self._fail(request_id, f"sampling failed: {error}")
        for request_id, why in picked.dead_ends.items():
            sequence = self._sequences[request_id]
            param = sequence.request.grammar.param  # type: ignore[union-attr]  # only a constrained row dead-ends
            num_tokens = sequence.scheduled.num_output_tokens
            self._fail(request_id, f"{param}: {why} (after {num_tokens} generated tokens)", refused_param=param)
        dropped = picked.failed.keys() | picked.dead_ends.keys()
        kept = [i for i, chunk in enumerate(batch.sampling_chunks) if chunk.request.request_id not in dropped]
        chunks = [chunk for chunk in batch.chunks if chunk.request.request_id not in dropped]
        token_ids = [picked.token_ids[i] for i in kept]
        logprobs = [picked.logprobs[i] for i in kept]
        return dataclasses.replace(batch, chunks=chunks), StepTokens(token_ids, logprobs, picked.verifications)

    # --- admission ---

    def _apply(self, new_work: NewWork) -> None:
        self._step_monitor = new_work.worker_monitor
        if new_work.embeddings:
            self._embedder.run(new_work.embeddings)
        for submission in new_work.submissions:
            try:
                self._admit(submission)
            except Exception as exc:  # one bad submission must not strand the others taken with it
                logger.exception("admitting request %s failed", submission.request.request_id)
                self._fail_submission(submission, f"the engine could not admit the request: {exc}")
        for request_id in new_work.cancelled:
            if self._scheduler.abort(request_id) is not None:
                self._finish(request_id, EngineOutput(request_id, [], FinishReason.ABORT))

    def _admit(self, submission: Submission) -> None:
        request = submission.request
        scheduled = scheduled_request(request, submission.sae, self._runner.eos_token_ids)
        generator = request_generator(request, self._runner.device)
        grammar = None if submission.grammar is None else RowGrammar(submission.grammar)
        sequence = EngineSequence(request, submission.on_output, generator, scheduled, submission.sae, grammar)
        self._sequences[request.request_id] = sequence
        field_error = submission.sae_error or submission.grammar_error
        error = (field_error and str(field_error)) or admission_error(
            request, self._runner.max_model_len, self._scheduler.max_tokens_fitting(), self._speculator.methods
        )
        if error is not None:
            param = field_error and field_error.param
            refusal = EngineOutput(request.request_id, [], error=error, is_request_error=True, error_param=param)
            self._finish(request.request_id, refusal)
        else:
            self._scheduler.add(scheduled)

    # --- per-row callbacks of the step ---

    def _speculation_allowance(self, request: Request) -> Allowance:
        sequence = self._sequences[request.request_id]
        is_monitored = self._step_monitor is not None
        return speculation_allowance(sequence, request, self._config, self._speculator.methods, is_monitored)

    def _sampling_row(self, request: Request) -> SamplingRow:
        return self._sequences[request.request_id].sampling_row()

    # --- outputs ---

    def _hand_to_grammar(self, update: TokenUpdate) -> bool:
        """A constrained row's matcher takes its appended token (and only that: it is what a preempted row keeps)
        with the row's next fill; False, failing the row, if it refused the one before. An EOS that a row ignoring
        EOS wrote is not the grammar's: the matcher would end there, and the row goes on (its text skips EOS too)."""
        grammar = self._sequences[update.request.request_id].grammar
        if grammar is None or not update.token_ids:  # max_tokens 0: nothing appended
            return True
        if grammar.refused_token_id is not None:
            self._fail(update.request.request_id, f"the grammar refused the sampled token {grammar.refused_token_id}")
            return False
        token_id = update.token_ids[-1]
        is_ignored_eos = token_id in self._runner.eos_token_ids and token_id not in update.request.stop_token_ids
        if not is_ignored_eos:
            grammar.pending_token_id = token_id
        return True

    def _emit(self, update: TokenUpdate, logprob: TokenLogprob | None) -> None:
        request_id = update.request.request_id
        sequence = self._sequences[request_id]
        finish_reason = FinishReason(update.finish_reason) if update.finish_reason else None
        output = EngineOutput(
            request_id,
            update.token_ids,
            finish_reason,
            logprobs=(logprob,) if logprob and update.token_ids else (),
            num_cached_tokens=max(update.request.num_cached_tokens, 0),
            num_proposed_tokens=sequence.num_proposed_tokens,
            num_accepted_tokens=sequence.num_accepted_tokens,
            prompt_logprobs=sequence.take_prompt_logprobs(),
        )
        if finish_reason is None:
            self._deliver(sequence, output)
        else:
            self._finish(request_id, output)

    def _fail(self, request_id: str, error: str, refused_param: str | None = None) -> None:
        """Ends the request with an error wherever it is, unless its final output has already gone out; with
        `refused_param`, the request's own error (the field at fault), not the engine's."""
        self._scheduler.abort(request_id)
        if request_id in self._sequences:
            is_refusal = refused_param is not None
            output = EngineOutput(request_id, [], error=error, is_request_error=is_refusal, error_param=refused_param)
            self._finish(request_id, output)

    def _fail_submission(self, submission: Submission, error: str) -> None:
        request_id = submission.request.request_id
        if request_id in self._sequences:
            self._fail(request_id, error)
            return
        self._inbox.finished(request_id)
        try:
            submission.on_output(EngineOutput(request_id, [], error=error))
        except Exception:
            logger.exception("output callback of request %s raised", request_id)

    def _finish(self, request_id: str, output: EngineOutput) -> None:
        sequence = self._sequences.pop(request_id)
        self._speculator.forget(request_id)
        self._inbox.finished(request_id)
        self._deliver(sequence, output)

    def _deliver(self, sequence: EngineSequence, output: EngineOutput) -> None:
        try:
            sequence.on_output(sequence.with_reports(output))
        except Exception:
            logger.exception("output callback of request %s raised", output.request_id)

    def _abort_all(self) -> None:
        for job in self._inbox.take_unrun_embeddings():
            job.fail("the engine stopped")
        for submission in self._inbox.take_unadmitted():
            request = submission.request
            scheduled = scheduled_request(request, None, self._runner.eos_token_ids)
            self._sequences[request.request_id] = EngineSequence(request, submission.on_output, None, scheduled)
        for request_id in list(self._sequences):
            self._scheduler.abort(request_id)
            self._finish(request_id, EngineOutput(request_id, [], FinishReason.ABORT))

    # --- counters ---

    def _record_verifications(self, picked: StepTokens, num_appended: dict[str, int]) -> None:
        for verification in picked.verifications:
            self._speculator.record(verification.request_id, verification.num_proposed, verification.num_accepted)
            sequence = self._sequences[verification.request_id]
            sequence.num_proposed_tokens += verification.num_proposed
            # accepted tokens past a stop token are dropped, so usage does not count them
            sequence.num_accepted_tokens += min(verification.num_accepted, num_appended[verification.request_id] - 1)

    def _record_step(self, batch: Batch) -> None:
        num_decode_tokens = sum(1 for chunk in batch.chunks if chunk.is_decode)
        with self._stats_lock:
            self._stats.record_step(len(batch.chunks), num_decode_tokens, batch.num_tokens)
            self._stats.num_preemptions = self._scheduler.num_preemptions
            self._stats.prefix_cache_queried_blocks = self._scheduler.num_prefix_queried_blocks
            self._stats.prefix_cache_hit_blocks = self._scheduler.num_prefix_hit_blocks
            self._stats.num_proposed_tokens = self._speculator.num_proposed_tokens
            self._stats.num_accepted_tokens = self._speculator.num_accepted_tokens
            self._stats.num_verifications = self._speculator.num_verifications
