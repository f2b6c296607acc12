"""The worker's engine: turns one PoolingCall into scheduled sequences and awaits their outputs.

On the event loop, ``submit`` checks params, tokenizes in a thread pool (one
batched ``encode_texts`` per call, then sentence-transformers-style
re-encoding of texts over the truncation length), checks lengths, and queues
one ``Sequence`` per input. One daemon thread loops: take a batch from the
scheduler, *prepare* it (drop sequences whose deadline passed), *run* it on
the runner, and resolve each sequence's future back on the loop. Prepare and
run are separate steps so batch N+1 can later be prepared while N runs.
A client that leaves cancels its sequences and the scheduler drops them.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from poolgate.shared.errors import DeadlineExceeded, InternalError, InvalidRequest, PoolgateError, Unavailable
from poolgate.shared.limits import check_length, check_params, check_token_ids, truncation_length
from poolgate.shared.wire import Input, PoolingCall, PoolingResult
from poolgate.workers.runner_api import Runner
from poolgate.workers.scheduler import TokenBudgetScheduler
from poolgate.workers.sequence import Sequence

log = logging.getLogger("poolgate.worker.engine")


@dataclass(frozen=True)
class Ticket:
    """A sequence's way back to its caller: the loop future and the call's deadline."""

    future: asyncio.Future
    deadline: float | None


class Engine:
    """Owns the scheduler, the tokenizer pool and the engine thread for one runner."""

    def __init__(self, runner: Runner, max_batch_tokens: int, tokenizer_threads: int = 1):
        self.runner = runner
        self.info = runner.info
        self.scheduler = TokenBudgetScheduler(max_batch_tokens)
        self._tokenizer = ThreadPoolExecutor(max(1, tokenizer_threads), thread_name_prefix="poolgate-tokenize")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._running = 0
        self._submits = 0  # submit() calls not yet returned
        self._idle = asyncio.Event()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._serve_batches, name="poolgate-engine", daemon=True)
        self._thread.start()

    async def stop(self, drain_timeout: float = 5.0) -> None:
        """Fail what is still queued, finish the running batch, join the thread, let submits return."""
        left = self.scheduler.close()
        _settle(left, error=Unavailable("worker is shutting down"))
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        if self._submits:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), drain_timeout)
            except asyncio.TimeoutError:
                log.warning("%d calls still pending after engine stop", self._submits)
        self._tokenizer.shutdown(wait=False)

    def load(self) -> dict:
        return {"queued": self.scheduler.queued, "queued_tokens": self.scheduler.queued_tokens,
                "running": self._running}

    async def submit(self, call: PoolingCall) -> PoolingResult:
        """Tokenize, check and queue every input of ``call``; resolve when all have run."""
        if self._thread is None or self.scheduler.closed:
            raise Unavailable("worker engine is not running")
        self._submits += 1
        try:
            return await self._submit(call)
        finally:
            self._submits -= 1
            if not self._submits:
                self._idle.set()

    async def _submit(self, call: PoolingCall) -> PoolingResult:
        check_params(self.info, call.params)
        _check_inputs(call.inputs)
        for x in call.inputs:
            if not isinstance(x, str):
                check_token_ids(self.info, x)
        k = truncation_length(self.info, call.params)
        token_lists = await self._loop.run_in_executor(self._tokenizer, self._tokenize, call.inputs, k)
        for ids in token_lists:
            check_length(self.info, len(ids))
        _check_deadline(call.deadline)
        seqs = [Sequence(ids, call.params, handle=Ticket(self._loop.create_future(), call.deadline))
                for ids in token_lists]
        try:
            for seq in seqs:
                self.scheduler.add(seq)
            outputs = await asyncio.gather(*(seq.handle.future for seq in seqs))
        except BaseException:
            for seq in seqs:  # client left, a sibling failed or shutdown: never run the rest
                seq.cancelled = True
                seq.handle.future.cancel()
            raise
        return PoolingResult(outputs=list(outputs), prompt_tokens=[seq.num_tokens for seq in seqs])

    def _tokenize(self, inputs: list[Input], k: int | None) -> list[list[int]]:
        """Token ids per input, in order; runs in the tokenizer pool."""
        ids: list[list[int]] = [list(x) if not isinstance(x, str) else [] for x in inputs]
        texts = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        if texts:
            for i, encoded in zip(texts, self.runner.encode_texts([inputs[i] for i in texts])):
                ids[i] = encoded
        if k is None:
            return ids
        too_long = [i for i in texts if len(ids[i]) > k]
        if too_long:
            encoded = self.runner.encode_texts([inputs[i] for i in too_long], max_tokens=k)
            for i, truncated in zip(too_long, encoded):
                ids[i] = truncated
        return [x[:k] for x in ids]  # k below a tokenizer's special-token count still keeps k

    def _serve_batches(self) -> None:
        """The engine thread: next batch, prepare, run, until the scheduler closes."""
        while not self.scheduler.closed:
            batch = self._prepare(self.scheduler.next_batch())
            if batch:
                self._run(batch)

    def _prepare(self, batch: list[Sequence]) -> list[Sequence]:
        """Fail sequences whose deadline has passed; return the ones to run."""
        now, live, expired = time.time(), [], []
        for seq in batch:
            late = seq.handle.deadline is not None and seq.handle.deadline < now
            (expired if late else live).append(seq)
        if expired:
            self._resolve(expired, error=DeadlineExceeded("deadline exceeded before the request was scheduled"))
        return live

    def _run(self, batch: list[Sequence]) -> None:
        """Run one prepared batch on the runner and hand each caller its output or the error."""
        self._running = len(batch)
        outputs, error = None, None
        try:
            outputs = self.runner.run(batch)
            if len(outputs) != len(batch):
                raise RuntimeError(f"runner returned {len(outputs)} outputs for {len(batch)} sequences")
        except PoolgateError as exc:
            error = exc
        except Exception as exc:
            log.exception("runner failed on a batch of %d sequences", len(batch))
            error = InternalError(f"runner failed: {exc}")
        self._running = 0
        self._resolve(batch, outputs, error)

    def _resolve(self, batch: list[Sequence], outputs=None, error: PoolgateError | None = None) -> None:
        try:
            self._loop.call_soon_threadsafe(_settle, batch, outputs, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _settle(batch: list[Sequence], outputs: list[np.ndarray] | None = None,
            error: PoolgateError | None = None) -> None:
    """On the loop: set each still-pending future's output or its own copy of the error."""
    for i, seq in enumerate(batch):
        future = seq.handle.future
        if future.done():
            continue
        if error is not None:
            future.set_exception(type(error)(error.message, param=error.param))
        else:
            future.set_result(outputs[i])


def _check_inputs(inputs: list) -> None:
    for x in inputs:
        if isinstance(x, str):
            _check_text(x)
            continue
        if not isinstance(x, list) or not all(_is_token_id(t) for t in x):
            raise InvalidRequest("each input must be a string or a list of non-negative integer token ids",
                                 param="input")


def _check_text(text: str) -> None:
    """Texts must be valid Unicode: JSON can carry lone surrogates that no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"input text is not valid Unicode ({exc.reason} at position {exc.start})",
                             param="input") from None


def _is_token_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and deadline < time.time():
        raise DeadlineExceeded("deadline exceeded before the request was scheduled")
