"""What a batch has done, as its files say: lines completed and failed, input tokens, the model that answered.

A batch that runs again after a restart reads its output and error files
once (``read_tally``, after ``JsonlSink`` has cut a line a kill left half
written), so its ``request_counts`` and ``usage`` count exactly the lines
those files hold; from there ``TallySink`` (the sink the job writes through)
notes the model of the first answer and tells the job's tracing which line
finished.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poolgate.gateway.jobs.lines import Line
from poolgate.gateway.jobs.sender import tokens_of
from poolgate.gateway.jobs.sinks import Sink


@dataclass
class Tally:
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    model: str | None = None


def read_tally(output: Path, errors: Path) -> Tally:
    """The lines, input tokens and model (the first answer's) in a batch's two files (missing: none)."""
    tally = Tally()
    if output.exists():
        with open(output, "rb") as f:
            for raw in f:
                body = (json.loads(raw).get("response") or {}).get("body")
                tally.completed += 1
                tally.tokens += tokens_of(body)
                if tally.model is None:
                    tally.model = _model(body)
    if errors.exists():
        with open(errors, "rb") as f:
            tally.failed = sum(1 for _ in f)
    return tally


def _model(body: Any) -> str | None:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


class TallySink:
    """``sink``, noting the first answer's model and calling ``finished(line number)`` for every line written."""

    def __init__(self, sink: Sink, model: str | None, finished: Callable[[int], None] | None = None):
        self.sink, self.model, self.finished = sink, model, finished
        self.done = sink.done

    def write_ok(self, line: Line, status: int, request_id: str, body: Any) -> None | str:
        refused = self.sink.write_ok(line, status, request_id, body)
        if self.model is None and refused is None:
            self.model = _model(body)
        if self.finished is not None and refused is None:  # a refused answer is written again as an error
            self.finished(line.number)
        return refused

    def write_error(self, obj: dict[str, Any]) -> None:
        self.sink.write_error(obj)
        line = (obj.get("error") or {}).get("line")
        if self.finished is not None and isinstance(line, int):
            self.finished(line)

    def close(self, finished: bool) -> None:
        self.sink.close(finished)
