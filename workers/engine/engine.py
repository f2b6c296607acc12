"""The worker's engine: a tokenized call in (``shared.wire.token_call``), its outputs as one block out, batches as a pipeline.

``submit_tokens`` (on the event loop) checks the call's token ids against the
model (``shared.domain.limits.check_token_call``: task and params, lengths, vocabulary)
and queues one ``Sequence`` per sequence (per chunk, for an embed input cut
by chunked processing: ``workers.engine.chunking``), each carrying its call's
priority, lane, deadline and arrival, all at once into the bounded scheduler (a
full queue answers ``Overloaded``, 429, and the gateway tries elsewhere; the
batch cut is the scheduler's policy object, by default ``fair``: priority levels with aging, bulk after every
live level, round robin over calls, ``workers.engine.fair_policy``). The worker never tokenizes on this path: the
gateway did, in front of its queue (``shared.inputs``). ``submit`` is the in-process way in (the offline API):
a call of inputs tokenized by the same ``shared.inputs.front`` first, in the
engine's tokenizer pool. Two threads then run batches as a two-stage pipeline:

- the *prepare* thread cuts the next batch from the scheduler, drops
  sequences whose call cannot finish by its deadline (it would pass before
  the batch's estimated device time is over; the call gets 504), and has the
  runner ``prepare`` it (packing, host buffers, the copy to the device);
- the *execute* thread has the runner ``execute`` each prepared batch and
  hands every call its rows.

At most one prepared batch waits. While batch N executes, batch N+1 is cut
and prepared only once the queue holds a full token budget, so under load the
host work hides behind the device, and at low load a batch is still
everything that queued while the last one ran. A batch's outputs are sliced
per call (views); a call's pieces are joined once, when its last sequence is
done (chunked inputs folded back to one row each, vectorized over the call),
and its future is resolved on the loop once. A multi-output call (``PoolingParams.outputs``) runs one forward per
batch like any other; each of its runs carries every output's rows (``runner_api.join_outputs``), gathered
per output, and the call answers one block per output (``PoolingResult.more``). A client that leaves cancels its
sequences and the scheduler drops them. An input over the token budget whose task pools LAST on a causal decoder
runs as chunks (``workers.engine.chunked_prefill``): its next chunk is queued once the last one ran.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from poolgate.shared.domain.errors import DeadlineExceeded, InternalError, InvalidRequest, PoolgateError, Unavailable
from poolgate.shared.domain.limits import cap_task, chunks_inputs
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.telemetry.log_limit import LogLimiter
from poolgate.shared.inputs.front import Front
from poolgate.shared.domain.limits import check_tokens, check_token_call
from poolgate.shared.wire.token_call import TokenCall
from poolgate.shared.wire.messages import PoolingCall, PoolingResult
from poolgate.workers.engine.cache import CachingRunner
from poolgate.workers.engine.calls import Call, call_runs, calls_of, check_deadline, resolve, settle
from poolgate.workers.engine.chunked_prefill import next_chunks, start_chunks
from poolgate.workers.engine.chunking import split
from poolgate.workers.engine.fair_policy import FairPolicy
from poolgate.workers.engine.oom import is_out_of_memory, run_in_halves
from poolgate.workers.engine.policy import BatchPolicy
from poolgate.workers.engine.runner_api import LoadedModel, RunOutput, Step, join_outputs
from poolgate.workers.models.run_loras import RunLoras
from poolgate.workers.engine.scheduler import TokenBudgetScheduler
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.engine.stats import PipelineStats

log = logging.getLogger("poolgate.worker.engine")
_failures = LogLimiter(log)  # a batch failure that repeats (a lost device) logs once per window

QUEUE_BUDGETS = 128  # the default queue bound, in token budgets (a backstop: the gateway admits less)


class CallTracer(Protocol):
    """``workers.engine.tracing``: the detailed spans of a finished call, from its perf_counter readings."""

    def trace(self, call: TokenCall, queued: float, started: float, steps: list[Step]) -> None: ...


@dataclass
class _Prepared:
    seqs: list[Sequence]
    segments: list[tuple[int, int, Call]]  # consecutive sequences of one call: [start, stop)
    batch: Any
    tokens: int


class Engine:
    """Owns the input stage, the scheduler, the tokenizer pool and the two pipeline threads."""

    def __init__(self, model: LoadedModel, tokenizer_threads: int | None = 1, *, tracer: CallTracer | None = None,
                 policy: BatchPolicy | None = None, max_queued_tokens: int | None = None,
                 max_tokens_per_request: int | None = None, media_limits: MediaLimits | None = None):
        # the limit travels in the info the gateway reads, which counts it where it tokenizes (and so does ``front``)
        self.info = replace(model.info, max_tokens_per_request=max_tokens_per_request)
        self.cache = CachingRunner(model.runner, model.cache_bytes) if model.cache_bytes else None  # engine.cache
        self.runner = self.cache or model.runner
        self.prefix_cache = getattr(model.runner, "prefix_cache", None)  # causal decoders (engine.prefix_cache)
        adapters = getattr(model.runner, "adapters", None)  # run-time LoRA slots (--max-loras): the ``lora`` op's
        self.loras = adapters if isinstance(adapters, RunLoras) else None
        self.chunked_prefill = getattr(model.runner, "chunked_prefill", None)  # (engine.chunked_prefill)
        self.max_batch_tokens = model.max_batch_tokens
        self._device_memory = model.device_memory
        self.front = Front(self.info, model.encoder, media_limits)  # in-process calls only (``submit``)
        bound = max_queued_tokens or QUEUE_BUDGETS * model.max_batch_tokens
        self.scheduler = TokenBudgetScheduler(model.max_batch_tokens, padded=model.padded,
                                              policy=policy if policy is not None else FairPolicy(),
                                              max_queued_tokens=bound)
        self.stats = PipelineStats()
        self.max_tokens_per_request = max_tokens_per_request
        self._tokenizer = ThreadPoolExecutor(max(1, tokenizer_threads or 2), thread_name_prefix="poolgate-tokenize")
        self._handoff: queue.SimpleQueue[_Prepared | None] = queue.SimpleQueue()
        self._slot = threading.Semaphore(1)  # one prepared batch may wait for the executor
        self._executing_since: float | None = None
        self._running = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._submits = 0  # submit() calls not yet returned
        self._live: set[Call] = set()  # queued or running calls (touched on the loop only)
        self._idle = asyncio.Event()
        self._tracer = tracer  # None: tracing off

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._threads = [
            threading.Thread(target=self._prepare_loop, name="poolgate-prepare", daemon=True),
            threading.Thread(target=self._execute_loop, name="poolgate-execute", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    async def stop(self, drain_timeout: float = 5.0) -> None:
        """Fail what is still queued or prepared, finish the running batch, join the threads."""
        left = self.scheduler.close()
        settle(calls_of(left), error=Unavailable("worker is shutting down"))
        for thread in self._threads:
            await asyncio.to_thread(thread.join)
        if self._submits:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), drain_timeout)
            except asyncio.TimeoutError:
                log.warning("%d calls still pending after engine stop", self._submits)
        self._tokenizer.shutdown(wait=False)

    def load(self) -> dict:
        """Queue and pipeline figures for the ``health`` op (and the gateway's /metrics)."""
        waiting = sum(1 for call in self._live if call.started is None)
        load = {"queued": self.scheduler.queued, "queued_tokens": self.scheduler.queued_tokens,
                "running": self._running, "requests_waiting": waiting,
                "requests_running": len(self._live) - waiting, "pipeline": self.stats.to_wire()}
        if self._device_memory is not None:
            load["device_memory"] = self._device_memory()
        if self.cache is not None:
            load["cache"] = self.cache.stats()
        if self.prefix_cache is not None:
            load["prefix_cache"] = self.prefix_cache.stats()
        return load

    async def submit(self, call: PoolingCall) -> PoolingResult:
        """An in-process call of inputs (the offline API, tests): tokenized by the model's ``shared.inputs.front``
        in the engine's tokenizer pool, run as its ``TokenCall``, its answer finished. The transport's calls
        come tokenized (``submit_tokens``)."""
        prepared = await self._loop_or_fail().run_in_executor(self._tokenizer, self.front.prepare, call)
        return self.front.finish(prepared, await self.submit_tokens(prepared.call))

    async def submit_tokens(self, call: TokenCall) -> PoolingResult:
        """Check and queue every sequence of ``call``; resolve, one row per sequence, when all have run."""
        self._loop_or_fail()
        self._submits += 1
        try:
            return await self._submit(call)
        finally:
            self._submits -= 1
            if not self._submits:
                self._idle.set()

    def _loop_or_fail(self) -> asyncio.AbstractEventLoop:
        if not self._threads or self.scheduler.closed or self._loop is None:
            raise Unavailable("worker engine is not running")
        return self._loop

    async def _submit(self, call: TokenCall) -> PoolingResult:
        check_token_call(self.info, call)
        check_deadline(call.deadline)
        token_lists, types, attend, media = call.sequences(), call.type_lists(), call.attend_lists(), call.media_lists()
        prompt_tokens = call.lengths()
        check_tokens(sum(prompt_tokens), self.max_tokens_per_request)
        state = Call(self._loop.create_future())
        if chunks_inputs(self.info, cap_task(call.params)) and call.media is None:  # embed: no pairs, no token types
            token_lists, state.chunks = split(token_lists, self.info.max_model_len, call.params)
            types = attend = media = [None] * len(token_lists)
        arrival = time.monotonic()
        state.seqs = [Sequence(ids, call.params, arrival=arrival, handle=state, token_type_ids=t,
                               priority=call.priority, deadline=call.deadline, attend=a, lane=call.lane, media=m)
                      for ids, t, a, m in zip(token_lists, types, attend, media)]
        if self.chunked_prefill is not None and start_chunks(state.seqs, self.chunked_prefill, self.max_batch_tokens):
            state.order = {id(seq): i for i, seq in enumerate(state.seqs)}  # rows by index (Call.order)
        state.queued_at = time.perf_counter()
        self._live.add(state)
        try:
            self.scheduler.add_all(state.seqs)  # whole or not at all: Overloaded when the queue is full
            rows = await state.future
        except BaseException:  # client left, the call failed or shutdown: never run the rest
            state.abandon()
            state.future.cancel()
            raise
        finally:
            self._live.discard(state)
        if self._tracer is not None:
            started = state.queued_at if state.started is None else state.started
            self._tracer.trace(call, state.queued_at, started, state.steps)
        outputs = call.params.outputs
        more = [PoolingResult(r, prompt_tokens) for r in state.more_rows(len(outputs))] if outputs else []
        return PoolingResult(outputs=rows, prompt_tokens=prompt_tokens, timings=state.timings(), more=more)

    # --- the prepare thread -------------------------------------------------

    def _prepare_loop(self) -> None:
        while True:
            self._slot.acquire()
            seqs = self.scheduler.next_batch(hold=self._is_executing)
            if not seqs:  # closed
                self._handoff.put(None)
                return
            try:
                prepared = self._prepare(seqs)
            except Exception as exc:  # never let the thread die with calls waiting on it
                _failures.log(logging.ERROR, ("prepare", repr(exc)), "preparing a batch of %d sequences failed",
                              len(seqs), exc_info=True)
                self._fail(calls_of(seqs), InternalError(f"worker failed to prepare a batch: {exc}"))
                prepared = None
            if prepared is None:
                self._slot.release()
            else:
                self._handoff.put(prepared)

    def _is_executing(self) -> bool:
        return self._executing_since is not None

    def _prepare(self, seqs: list[Sequence]) -> _Prepared | None:
        """Drop sequences of calls that cannot finish by their deadline (this batch's device time at the
        measured rate from now), then have the runner prepare the rest."""
        rate = self.stats.tokens_per_s
        finish = time.time() + (sum(seq.num_tokens for seq in seqs) / rate if rate else 0.0)
        live, late = [], set()
        for seq in seqs:
            call = seq.handle
            if seq.deadline is not None and seq.deadline < finish:
                late.add(call)
            elif not call.failed:
                live.append(seq)
        if late:
            self._fail(late, DeadlineExceeded("deadline exceeded before the request was scheduled"))
            live = [seq for seq in live if seq.handle not in late]
        if not live:
            return None
        segments = call_runs(live)
        start = time.perf_counter()
        try:
            batch = self.runner.prepare(live)
        except Exception as exc:
            _failures.log(logging.ERROR, ("runner.prepare", repr(exc)), "runner failed to prepare a batch of %d "
                          "sequences", len(live), exc_info=True)
            self._fail({c for _, _, c in segments}, InternalError(f"runner failed: {exc}"))
            return None
        end = time.perf_counter()
        self.stats.prepare_s += end - start
        since = self._executing_since
        if since is not None and since < end:
            self.stats.prepare_overlapped_s += end - max(start, since)
        return _Prepared(live, segments, batch, sum(seq.num_tokens for seq in live))

    # --- the execute thread -------------------------------------------------

    def _execute_loop(self) -> None:
        while (prepared := self._handoff.get()) is not None:
            self._executing_since = time.perf_counter()  # busy before the slot opens: no early partial cut
            self._slot.release()
            calls = {c for _, _, c in prepared.segments}
            try:
                self._execute(prepared, calls)
            except Exception as exc:  # never let the thread die with calls waiting on it
                _failures.log(logging.ERROR, ("deliver", repr(exc)), "delivering a batch of %d sequences failed",
                              len(prepared.seqs), exc_info=True)
                self._fail(calls, InternalError(f"worker failed on a batch: {exc}"))
            finally:
                self._executing_since, self._running = None, 0
                self.scheduler.wake()

    def _execute(self, prepared: _Prepared, calls: set[Call]) -> None:
        """Run one prepared batch and hand each call its rows (or the batch's error)."""
        if self.scheduler.closed:
            self._fail(calls, Unavailable("worker is shutting down"))
            return
        self._running = len(prepared.seqs)
        start = time.perf_counter()
        for call in calls:  # from now on the call is running, not waiting
            call.started = start if call.started is None else call.started
        steps: list[Step] | None = [] if self._tracer is not None else None
        try:
            outputs = self._run(prepared, steps)
        except PoolgateError as exc:
            self._fail(calls, exc)
            return
        except Exception as exc:
            _failures.log(logging.ERROR, ("runner.execute", repr(exc)), "runner failed on a batch of %d sequences",
                          len(prepared.seqs), exc_info=True)
            self._fail(calls, InternalError(f"runner failed: {exc}"))
            return
        finally:
            end = time.perf_counter()
            self.stats.execute_s += end - start
            self._running = 0  # before any call is resolved: a caller never sees its own batch running
        self.stats.record_batch(len(prepared.seqs), prepared.tokens, self.scheduler.max_batch_tokens, end - start)
        self.scheduler.tokens_per_s = self.stats.tokens_per_s
        for call in calls:
            call.finished = end
            if steps:
                call.steps += steps
        self._deliver(prepared.segments, outputs, prepared.seqs, self._next_chunks(prepared.seqs))

    def _run(self, prepared: _Prepared, steps: list[Step] | None) -> list[RunOutput]:
        """The runner's outputs for the batch; on device out-of-memory, those of its halves
        (``workers.engine.oom``), failing with a 400 only the calls of an input too big to run alone."""
        try:
            outputs = join_outputs(self.runner.execute(prepared.batch, steps))  # a multi-output run: one each
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            prepared.batch = None  # its device buffers go before the halves are uploaded
            split = run_in_halves(self.runner, prepared.seqs, steps)
            self._out_of_memory(prepared, split, exc)
            return join_outputs(split.outputs)
        _check_cover(outputs, len(prepared.seqs))
        return outputs

    def _out_of_memory(self, prepared: _Prepared, split, exc: BaseException) -> None:
        """Count it, say it once in the log, and fail the calls whose input cannot fit alone."""
        self.stats.out_of_memory += 1
        level = logging.WARNING if self.stats.out_of_memory == 1 else logging.DEBUG
        log.log(level, "device out of memory on a batch of %d sequences (%d tokens): ran it in %d parts; %d "
                "input(s) too big alone (%s; later ones are counted in the worker's out_of_memory stat)",
                len(prepared.seqs), prepared.tokens, split.runs, len(split.too_big), exc)
        for i in split.too_big:
            seq = prepared.seqs[i]
            self._fail([seq.handle], InvalidRequest(
                f"An input of {seq.num_tokens} tokens does not fit in the device's memory, even alone; "
                "send a shorter input (or truncate it).", param="input"))

    def _next_chunks(self, seqs: list[Sequence]) -> set[int]:
        """Queue the next chunk of each input whose chunk just ran; the batch indexes of chunks that do not pool."""
        partial, more = next_chunks(seqs)
        try:
            self.scheduler.requeue(more)
        except PoolgateError as exc:  # shutting down
            self._fail(calls_of(more), exc)
        return partial

    def _deliver(self, segments: list[tuple[int, int, Call]], outputs: list[RunOutput], seqs: list[Sequence],
                 partial: set[int]) -> None:
        """Give each call its slice of every run (not a chunk's that does not pool); resolve the complete calls."""
        finished = []
        for run in outputs:
            for lo, hi, call in segments:
                a, b = max(lo, run.start), min(hi, run.stop)
                if a >= b or call.failed:
                    continue
                if call.order is not None:  # chunked prefill: by input index, a row at a time
                    if call.take(run.rows, run.start, [(j, seqs[j], j in partial) for j in range(a, b)]):
                        finished.append((call, call.rows()))
                    continue
                call.pieces.append(run.rows.slice(a - run.start, b - run.start))
                if run.more:
                    call.more.append(tuple(rows.slice(a - run.start, b - run.start) for rows in run.more))
                call.done += b - a
                if call.done == len(call.seqs):
                    finished.append((call, call.rows()))
        if finished:
            self._call_soon(resolve, finished)

    def _fail(self, calls, error: PoolgateError) -> None:
        for call in calls:
            call.abandon()
        self._call_soon(settle, list(calls), error)

    def _call_soon(self, fn, *args) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _check_cover(outputs: list[RunOutput], n: int) -> None:
    """The runner's outputs must cover sequences 0..n in order, with one output each."""
    at = 0
    for run in outputs:
        if run.start != at or run.stop <= run.start or len(run.rows) != run.stop - run.start:
            raise InternalError(f"runner outputs do not cover the batch (at {at}: {run.start}..{run.stop})")
        at = run.stop
    if at != n:
        raise InternalError(f"runner returned outputs for {at} of {n} sequences")
