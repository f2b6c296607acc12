"""Runs one job: its input's lines through a ``Sender``, each finished line into a ``Sink`` once.

Lines are read in order and sent with at most ``max_inflight`` in flight
(enough for the workers to pack full batches; the rest wait here, not in
the gateway's queue), or fewer when ``inflight`` says so. A line already in the sink's ``done`` set (a re-run
after a kill) is skipped; a malformed line, a duplicate ``custom_id`` or a
route's error is written to the error file and the job goes on. Blank lines
are skipped. ``run_job`` returns the job's counts when every line is done,
or raises what stopped it (``sender.JobStopped``, a cancel), with the
lines finished so far already written.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from poolgate.gateway.jobs.lines import MAX_CUSTOM_ID_CHARS, Line, LineError, error_line, error_of, parse_line
from poolgate.gateway.jobs.sender import Answer, Sender, tokens_of
from poolgate.gateway.jobs.sinks import Sink


@dataclass
class Counts:
    """A job's lines: ``total`` (non-blank lines in the input), ``skipped`` (done by an earlier run),
    ``completed`` and ``failed`` (by this run), and the input tokens of this run's successes."""

    total: int = 0
    skipped: int = 0
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    listeners: list[Callable[[Counts], None]] = field(default_factory=list, repr=False, compare=False)

    @property
    def finished(self) -> int:
        return self.skipped + self.completed + self.failed

    def changed(self) -> None:
        for listener in self.listeners:
            listener(self)


def count_lines(path: Path) -> int:
    """The non-blank lines of an input file (the job's total), read in blocks."""
    n = 0
    with open(path, "rb") as f:
        for raw in f:
            n += bool(raw.strip())
    return n


def read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each non-blank line."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if raw.strip():
                yield number, raw


def all_done(lines: Iterable[tuple[int, bytes]], done: set[str | int]) -> bool:
    """Whether every line is in ``done``, each keyed as ``run_job`` writes it (its custom_id; by its number a
    line without a usable one, or a second line of an id); reads each line's custom_id only."""
    seen: set[str] = set()
    for number, raw in lines:
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        custom_id = obj.get("custom_id") if isinstance(obj, dict) else None
        key: str | int = number
        if isinstance(custom_id, str) and 0 < len(custom_id) <= MAX_CUSTOM_ID_CHARS:
            if custom_id not in seen:
                key = custom_id
            seen.add(custom_id)
        if key not in done:
            return False
    return True


async def run_job(
    lines: Iterable[tuple[int, bytes]],
    sink: Sink,
    sender: Sender,
    counts: Counts,
    *,
    max_inflight: int = 64,
    endpoint: str | None = None,
    headers: Callable[[Line], dict[str, str]] | None = None,
    inflight: Callable[[], int] | None = None,
) -> Counts:
    """Every line of ``lines`` finished into ``sink`` (module doc); ``endpoint``: the url every line must name;
    ``headers``: extra request headers per line (a trace context); ``inflight``: the lines in flight allowed
    now (at most ``max_inflight``, at least 1), asked before each line is sent (a gateway's own job sends
    fewer while live requests run)."""
    seen: set[str] = set()
    running: set[asyncio.Task] = set()
    failure: list[BaseException] = []

    async def one(line: Line) -> None:
        try:
            answer = await sender.send(line, headers(line) if headers is not None else None)
            _record(sink, counts, line, answer)
        except BaseException as exc:  # JobStopped or a cancel: the job stops; the line is redone next run
            failure.append(exc)

    try:
        for number, raw in lines:
            if failure:
                break
            try:
                line = parse_line(raw, number, endpoint)
            except LineError as err:
                if err.custom_id is not None and err.custom_id in seen:
                    err = LineError(number, err.message, code=err.code)  # a second line of that id: by number
                elif err.custom_id is not None:
                    seen.add(err.custom_id)
                key = err.custom_id if err.custom_id is not None else number
                if key in sink.done:
                    counts.skipped += 1
                else:
                    sink.write_error(error_line(number, err.custom_id, err.code, err.message))
                    counts.failed += 1
                counts.changed()
                continue
            if line.custom_id in seen:
                if number in sink.done:
                    counts.skipped += 1
                else:
                    message = f"line {number}: custom_id {line.custom_id!r} was already used by an earlier line"
                    sink.write_error(error_line(number, None, "duplicate_custom_id", message))
                    counts.failed += 1
                counts.changed()
                continue
            seen.add(line.custom_id)
            if line.custom_id in sink.done:
                counts.skipped += 1
                counts.changed()
                continue
            while len(running) >= max(1, min(max_inflight, inflight() if inflight is not None else max_inflight)):
                await asyncio.wait(set(running), return_when=asyncio.FIRST_COMPLETED)
            task = asyncio.create_task(one(line))
            running.add(task)
            task.add_done_callback(running.discard)
        if running:
            await asyncio.wait(set(running))
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(set(running))
    if failure:
        raise failure[0]
    return counts


def _record(sink: Sink, counts: Counts, line: Line, answer: Answer) -> None:
    if answer.status == 200:
        refused = sink.write_ok(line, answer.status, answer.request_id, answer.body)
        if refused is None:
            counts.completed += 1
            counts.tokens += tokens_of(answer.body)
            counts.changed()
            return
        sink.write_error(
            error_line(
                line.number,
                line.custom_id,
                "output_format",
                refused,
                status=answer.status,
                request_id=answer.request_id,
            )
        )
    else:
        code, message = error_of(answer.status, answer.body)
        sink.write_error(
            error_line(
                line.number,
                line.custom_id,
                code,
                message,
                status=answer.status,
                request_id=answer.request_id,
                body=answer.body,
            )
        )
    counts.failed += 1
    counts.changed()
