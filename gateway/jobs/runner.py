"""The Batch API's runner: a background task of the gateway that runs every batch of the store to its end.

``BatchRunner.run`` is a cleanup_ctx (``gateway.launch`` adds it in the one
process that runs jobs: the first of ``--gateway-processes N``). Once the
gateway is ready, and then every ``POLL_S`` or as soon as a route of this
process makes or cancels a batch, it reads the batches not yet ended, oldest
first, and:

- starts the oldest ones waiting (``validating``, or ``in_progress`` /
  ``finalizing`` left by a stop or a kill: resumed from their files), up to
  ``JOBS_AT_ONCE`` at a time (``gateway.jobs.batch_job``); a batch waiting
  for its turn shows ``validating``;
- stops a running batch that is ``cancelling`` (ends ``cancelled``) or past
  its 24-hour window (ends ``expired``), and ends such a batch that is not
  running straight away;
- every ``SWEEP_S``, removes the files past their expiry that no batch not
  yet ended reads.

One runner per ``--batch-dir``: before its first round it takes an exclusive
lock on ``DIR/runner.lock`` (``flock``; the kernel drops it when the process
ends, SIGKILL included). A second gateway started on the same folder answers
the API but its runner waits, trying again every ``lock_retry_s``, and takes
over when the first is gone, so no two runners ever send one batch's lines.

Each batch's lines go to this gateway's own routes over a private unix
socket (``socket``: a ``UnixSite`` on the app's own runner, in an
owner-only folder; ``gateway.launch``), as the batch's tenant
(``gateway.http.trusted``), so every line meets the same middleware, quotas,
admission, dialects, spans and metrics as a live request (a 429 or a 503
just waits: ``gateway.jobs.sender``). At shutdown the running batches are
left ``in_progress`` (the lines in flight are dropped, never half written)
and the next start resumes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

from aiohttp import web

from poolgate.gateway.http.state import CONFIG, ROUTER, TELEMETRY
from poolgate.gateway.http.trusted import TRUSTED
from poolgate.gateway.jobs.batch_job import PROGRESS_S, BatchJob, end_batch
from poolgate.gateway.jobs.metrics import BATCH_METRICS
from poolgate.gateway.jobs.sender import Sender
from poolgate.gateway.jobs.service import BATCH_API, BatchApi
from poolgate.gateway.jobs.spans import CHUNK_LINES
from poolgate.gateway.jobs.store import Row

log = logging.getLogger("poolgate.batch")

JOBS_AT_ONCE = 2
POLL_S = 1.0
SWEEP_S = 60.0
UNREACHABLE_S = 600.0  # no answer at all from our own socket this long: the batch waits for the next try
LINE_TIMEOUT_S = 600.0  # a line's X-Request-Timeout when the gateway has no --request-timeout
LOCK_NAME = "runner.lock"
LOCK_RETRY_S = 5.0


class BatchRunner:
    """Runs the batches of the app's ``BatchApi`` (module doc) through the unix socket ``socket``."""

    def __init__(
        self,
        socket: str,
        *,
        ready: asyncio.Event | None = None,
        jobs_at_once: int = JOBS_AT_ONCE,
        poll_s: float = POLL_S,
        progress_s: float = PROGRESS_S,
        chunk_lines: int = CHUNK_LINES,
        lock_retry_s: float = LOCK_RETRY_S,
    ):
        self.socket, self.ready = socket, ready
        self.jobs_at_once, self.poll_s, self.progress_s, self.chunk_lines = (
            jobs_at_once,
            poll_s,
            progress_s,
            chunk_lines,
        )
        self.running: dict[str, BatchJob] = {}
        self._tasks: set[asyncio.Task] = set()
        self._app: web.Application | None = None
        self._lock: IO[bytes] | None = None
        self.lock_retry_s = lock_retry_s

    @property
    def api(self) -> BatchApi:
        assert self._app is not None
        return self._app[BATCH_API]

    async def run(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: the runner's loop from start-up to shutdown (module doc)."""
        self._app = app
        loop = asyncio.create_task(self._loop(), name="batch runner")
        try:
            yield
        finally:
            loop.cancel()
            for task in self._tasks:
                task.cancel()
            await asyncio.wait([loop, *self._tasks])
            if self._lock is not None:
                self._lock.close()  # the lock goes with it

    async def _take_the_folder(self) -> None:
        """Wait until this runner holds ``DIR/runner.lock`` (module doc)."""
        path = Path(self.api.config.dir) / LOCK_NAME
        self._lock = await asyncio.to_thread(open, path, "ab")
        said = False
        while not await asyncio.to_thread(_try_lock, self._lock):
            if not said:
                log.warning("another gateway runs the batches of %s; this one takes over when it stops", path.parent)
                said = True
            await asyncio.sleep(self.lock_retry_s)
        if said:
            log.info("this gateway runs the batches of %s now", path.parent)

    async def _loop(self) -> None:
        if self.ready is not None:
            await self.ready.wait()
        await self._take_the_folder()
        api, swept = self.api, 0.0
        while True:
            api.wake.clear()
            try:
                await self._tick()
                if api.clock() - swept >= SWEEP_S:
                    swept = api.clock()
                    await self._sweep()
            except Exception:  # the store unreadable for a moment (a locked database): try again next time
                log.exception("batch runner: a round failed; trying again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(api.wake.wait(), self.poll_s)

    async def _tick(self) -> None:
        api = self.api
        rows = await asyncio.to_thread(api.store.active)
        now = api.now()
        for row in rows:
            over = row["status"] in ("validating", "in_progress") and row["expires_at"] <= now
            job = self.running.get(row["id"])
            if job is not None:
                if row["status"] == "cancelling" or over:
                    job.stop("cancelled" if row["status"] == "cancelling" else "expired")
            elif row["status"] == "cancelling" or over:
                status = "cancelled" if row["status"] == "cancelling" else "expired"
                if await end_batch(api, row, status):
                    log.info("batch %s %s", row["id"], status)
            elif len(self.running) < self.jobs_at_once:
                self._start(row)

    def _start(self, row: Row) -> None:
        assert self._app is not None
        app = self._app
        config = app[CONFIG]
        sender = Sender(
            unix=self.socket,
            headers=app[TRUSTED].headers(row["owner"]),
            line_timeout_s=config.request_timeout_s or LINE_TIMEOUT_S,
            unreachable_s=UNREACHABLE_S,
            connections=self.api.config.max_inflight,
        )
        tracer = getattr(app[TELEMETRY].tracer, "tracer", None)  # the OpenTelemetry tracer, when tracing is on
        job = BatchJob(
            self.api,
            row,
            sender,
            tracer=tracer,
            metrics=app.get(BATCH_METRICS),
            progress_s=self.progress_s,
            chunk_lines=self.chunk_lines,
            live_jobs=app[ROUTER].live_jobs,
        )
        self.running[job.id] = job
        task = asyncio.create_task(job.run(), name=f"batch {job.id}")
        self._tasks.add(task)

        def done(task: asyncio.Task) -> None:
            self._tasks.discard(task)
            self.running.pop(job.id, None)
            if not task.cancelled() and task.exception() is not None:
                log.error("batch %s: its run ended with an error", job.id, exc_info=task.exception())
            self.api.wake.set()  # the next batch may start

        task.add_done_callback(done)

    async def _sweep(self) -> None:
        store = self.api.store
        for file_id in await asyncio.to_thread(store.expired_files, self.api.now()):
            await asyncio.to_thread(store.path(file_id).unlink, True)
            log.info("file %s expired and was removed", file_id)


def _try_lock(file: IO[bytes]) -> bool:
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
