"""One run of one batch: check its input, run its lines, keep its counts, end it in its final status.

A batch in ``validating`` has its input checked as a whole
(``gateway.jobs.validate``): a file-level fault ends it ``failed``; else it
moves to ``in_progress`` with its line count and the ids its output and
error files will have. Its lines then run through ``run_job`` (the job
loop ``run-batch`` runs too, ``gateway.jobs.job``) into a ``JsonlSink`` on those two files, each
line sent by the ``Sender`` as the HTTP request it describes. A batch found
``in_progress`` (or ``finalizing``) runs the same way: the sink reads from
its own files what an earlier run finished (a gateway killed mid-batch), the
counts start from what the files hold (``gateway.jobs.tally``), and only the
rest is sent, so no line is lost or written twice.

Beside live traffic it yields in the gateway too, not only in the workers'
queues (where its lines run after every live call, ``X-Poolgate-Lane:
bulk``): while this gateway has live requests in flight (``live_jobs``) it
sends at most ``BESIDE_LIVE_INFLIGHT`` lines at once instead of
``--batch-max-inflight``, so its lines do not take the gateway's own CPU
(parsing, tokenizing, encoding answers) from live requests; with none, it
runs at full speed again.

While it runs, its ``request_counts``, input tokens and model are written to
the store every ``PROGRESS_S``. It ends:

- all lines done: ``finalizing``, then ``completed`` with its files
  registered (a file only when it holds a line, as OpenAI's);
- ``stop("cancelled")`` (the batch is ``cancelling``) or ``stop("expired")``
  (24 hours passed): no more lines are sent, those in flight are dropped, and
  it ends ``cancelled`` / ``expired`` with the lines finished so far in its
  files;
- the gateway stops (the task is cancelled): it stays ``in_progress`` and the
  next start resumes it; likewise when the gateway cannot be reached
  (``GatewayGone``);
- the gateway refuses the batch's tenant (``NotAllowed``: its keys were
  removed from the keys file): ``failed`` with ``not_allowed`` (no line
  could run);
- anything unexpected (a full disk): ``failed``, the error in its ``errors``
  (the lines finished so far in its files).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from poolgate.gateway.jobs.job import Counts, read_lines, run_job
from poolgate.gateway.jobs.metrics import BatchMetrics
from poolgate.gateway.jobs.sender import GatewayGone, NotAllowed, Sender
from poolgate.gateway.jobs.service import BatchApi
from poolgate.gateway.jobs.sinks import JsonlSink, repair_tail
from poolgate.gateway.jobs.spans import CHUNK_LINES, JobSpans
from poolgate.gateway.jobs.store import ACTIVE, Row, new_file_id
from poolgate.gateway.jobs.tally import Tally, TallySink, read_tally
from poolgate.gateway.jobs.validate import check_input

log = logging.getLogger("poolgate.batch")

BESIDE_LIVE_INFLIGHT = 2  # lines in flight while live requests are (module doc)

PROGRESS_S = 1.0
OUTPUT_PURPOSE = "batch_output"
ENDS: dict[str, tuple[str, tuple[str, ...]]] = {  # a final status -> its time field, and the statuses it ends
    "completed": ("completed_at", ("finalizing",)),
    "cancelled": ("cancelled_at", ("cancelling",)),
    "expired": ("expired_at", ("validating", "in_progress", "cancelling")),
    "failed": ("failed_at", ACTIVE),
}


class BatchJob:
    """One run of the batch ``row`` (module doc); ``tracer``: an OpenTelemetry tracer, or None."""

    def __init__(
        self,
        api: BatchApi,
        row: Row,
        sender: Sender,
        *,
        tracer: Any = None,
        metrics: BatchMetrics | None = None,
        progress_s: float = PROGRESS_S,
        chunk_lines: int = CHUNK_LINES,
        live_jobs: Callable[[], int] | None = None,
    ):
        self.api, self.row, self.sender = api, row, sender
        self.live_jobs = live_jobs
        self.tracer, self.metrics, self.progress_s, self.chunk_lines = tracer, metrics, progress_s, chunk_lines
        self.reason: str | None = None  # why ``stop`` was called: "cancelled" or "expired"
        self._lines: asyncio.Task | None = None

    @property
    def id(self) -> str:
        return self.row["id"]

    def inflight(self) -> int:
        """The lines it may have in flight now: ``--batch-max-inflight``, or ``BESIDE_LIVE_INFLIGHT`` while this
        gateway has live requests in flight (module doc)."""
        if self.live_jobs is not None and self.live_jobs() > 0:
            return BESIDE_LIVE_INFLIGHT
        return self.api.config.max_inflight

    def stop(self, reason: str) -> None:
        """End the batch as ``reason`` ("cancelled", "expired"): no more lines are sent."""
        if self.reason is None:
            self.reason = reason
        if self._lines is not None:
            self._lines.cancel()

    async def run(self) -> None:
        """The run (module doc); anything unexpected ends the batch ``failed`` (never a retry loop)."""
        try:
            await self._run()
        except Exception as exc:
            log.exception("batch %s failed", self.id)
            await end_batch(
                self.api, self.row, "failed", errors=[_error("internal_error", f"{type(exc).__name__}: {exc}")]
            )

    async def _run(self) -> None:
        store = self.api.store
        if self.row["status"] == "validating" and not await self._validate():
            return
        output, errors = store.path(self.row["output_path_id"]), store.path(self.row["error_path_id"])
        sink, base = await asyncio.to_thread(_open, output, errors)
        if base.completed or base.failed:
            done = base.completed + base.failed
            log.info("batch %s: resuming, %d of %d lines were done before", self.id, done, self.row["total"])
        spans = JobSpans(self.tracer, self.row, self.chunk_lines) if self.tracer is not None else None
        tally = TallySink(sink, base.model, spans.finished if spans is not None else None)
        counts = Counts(total=self.row["total"])
        if self.metrics is not None:
            counts.listeners.append(self.metrics.counting(self.row["owner"]))
        progress = asyncio.create_task(self._keep_writing(counts, base, tally))
        status: str | None = None
        error: str | None = None
        try:
            status = await self._run_lines(tally, counts, spans)
        except GatewayGone as exc:
            log.error("batch %s: %s; it goes on when the gateway answers again", self.id, exc)
        except NotAllowed as exc:  # the tenant's lines are refused (its keys are gone): no line could run
            log.error("batch %s failed: %s", self.id, exc)
            status, error = "failed", str(exc)
        except Exception as exc:  # ``run`` ends the batch failed
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            progress.cancel()
            sink.close(status is not None)
            await asyncio.shield(self._write_counts(counts, base, tally))
            if spans is not None:
                ended = status or ("failed" if error else self.row["status"])
                spans.end(ended, self._totals(counts, base, tally), error)
        if status is not None:
            refused = [_error("not_allowed", error)] if error is not None else None
            await self._end(status, self._totals(counts, base, tally), refused)

    async def _validate(self) -> bool:
        """Check the input (``validate``); whether the batch is ``in_progress`` now."""
        store, row = self.api.store, self.row
        checked = await asyncio.to_thread(check_input, store.path(row["input_file_id"]), self.api.config.max_lines)
        now = self.api.now()
        if checked.errors:
            log.info("batch %s failed validation: %s", self.id, checked.errors[0]["message"])
            await asyncio.to_thread(
                lambda: store.move(
                    self.id, ("validating",), status="failed", failed_at=now, errors=list(checked.errors)
                )
            )
            return False
        fields = {"output_path_id": new_file_id(), "error_path_id": new_file_id(), "total": checked.total}
        started = await asyncio.to_thread(
            lambda: store.move(self.id, ("validating",), status="in_progress", in_progress_at=now, **fields)
        )
        if started:
            self.row = await asyncio.to_thread(store.batch, self.id)
            log.info("batch %s: %d lines to %s", self.id, checked.total, self.row["endpoint"])
        return started and self.reason is None

    async def _run_lines(self, tally: TallySink, counts: Counts, spans: JobSpans | None) -> str | None:
        """Run the lines; the final status, or None when the gateway stops (the batch is left as it is)."""
        async with self.sender:
            self._lines = asyncio.create_task(
                run_job(
                    read_lines(self.api.store.path(self.row["input_file_id"])),
                    tally,
                    self.sender,
                    counts,
                    max_inflight=self.api.config.max_inflight,
                    inflight=self.inflight,
                    endpoint=self.row["endpoint"],
                    headers=spans.headers if spans is not None else None,
                )
            )
            if self.reason is not None:
                self._lines.cancel()
            try:
                await self._lines
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if self.reason is None or (task is not None and task.cancelling()):
                    raise  # the gateway stops: the batch stays in_progress, resumed at the next start
                return self.reason
        return "completed"

    def _totals(self, counts: Counts, base: Tally, tally: TallySink) -> dict[str, Any]:
        return {
            "completed": base.completed + counts.completed,
            "failed": base.failed + counts.failed,
            "input_tokens": base.tokens + counts.tokens,
            "model": tally.model,
        }

    async def _write_counts(self, counts: Counts, base: Tally, tally: TallySink) -> None:
        totals = self._totals(counts, base, tally)
        await asyncio.to_thread(lambda: self.api.store.move(self.id, ACTIVE, **totals))

    async def _keep_writing(self, counts: Counts, base: Tally, tally: TallySink) -> None:
        while True:
            await asyncio.sleep(self.progress_s)
            await self._write_counts(counts, base, tally)

    async def _end(self, status: str, totals: dict[str, Any], errors: list[dict] | None = None) -> None:
        store, now = self.api.store, self.api.now()
        if status == "completed":
            moved = await asyncio.to_thread(
                lambda: store.move(self.id, ("in_progress", "finalizing"), status="finalizing", finalizing_at=now)
            )
            if not moved:  # a cancel came as the last lines finished: it ends cancelled, every line in its files
                status = "cancelled"
        await end_batch(self.api, self.row, status, errors=errors, totals=totals)
        log.info("batch %s %s", self.id, status)


def _error(code: str, message: str) -> dict[str, Any]:
    """One entry of a batch's ``errors`` (OpenAI's BatchError)."""
    return {"code": code, "message": message, "line": None, "param": None}


def _open(output: Path, errors: Path) -> tuple[JsonlSink, Tally]:
    sink = JsonlSink(output, errors)  # cuts a line a kill left half written
    return sink, read_tally(output, errors)


async def end_batch(
    api: BatchApi, row: Row, status: str, *, errors: list[dict] | None = None, totals: dict[str, Any] | None = None
) -> bool:
    """Move ``row``'s batch to the final ``status`` with its output and error files registered (those that
    hold a line) and its counts (``totals``, or read from the files); whether it was still in a status
    ``status`` ends."""
    time_field, from_ = ENDS[status]
    now = api.now()
    files, ids, counted = await asyncio.to_thread(_outputs, api, row, now, totals is None)
    fields = {"status": status, time_field: now, **ids, **(totals or counted)}
    if errors is not None:
        fields["errors"] = errors
    return await asyncio.to_thread(lambda: api.store.finish(row["id"], from_, files, **fields))


def _outputs(api: BatchApi, row: Row, now: int, count: bool) -> tuple[list[Row], dict[str, Any], dict[str, Any]]:
    """The File rows of a batch's output and error files (an empty one is removed), the batch's fields naming
    them, and (``count``) the lines, tokens and model they hold."""
    if row["output_path_id"] is None:  # it never started: no files, no lines
        return [], {}, {}
    store, expiry = api.store, row["output_expires_s"]
    paths = {"output": store.path(row["output_path_id"]), "error": store.path(row["error_path_id"])}
    for path in paths.values():
        if path.exists():
            repair_tail(path)
    files, ids = [], {}
    for kind, path in paths.items():
        size = path.stat().st_size if path.exists() else 0
        if size == 0:
            path.unlink(missing_ok=True)
            continue
        ids[f"{kind}_file_id"] = path.name
        files.append(
            {
                "id": path.name,
                "owner": row["owner"],
                "purpose": OUTPUT_PURPOSE,
                "filename": f"{row['id']}_{kind}.jsonl",
                "bytes": size,
                "created_at": now,
                "expires_at": now + expiry if expiry is not None else None,
            }
        )
    if not count:
        return files, ids, {}
    tally = read_tally(paths["output"], paths["error"])
    return (
        files,
        ids,
        {"completed": tally.completed, "failed": tally.failed, "input_tokens": tally.tokens, "model": tally.model},
    )
