"""A batch's input file checked as a whole before any line runs: what fails the batch, not one line.

The batch fails (``failed``, with the reason in its ``errors``) when its
input file:

- is gone (deleted or expired before the batch started): ``missing_file``;
- has no line at all (blank lines do not count): ``empty_file``;
- has more than ``--batch-max-lines`` lines: ``too_many_lines``;
- is not JSONL, i.e. not one of its lines is a JSON object (a CSV, one JSON
  document over several lines, a binary file): ``invalid_file``.

Anything else wrong is one line's, decided when the line runs
(``gateway.jobs.job``): a line that is not JSON, names another url than the
batch's endpoint, repeats a custom_id, or has a body its route refuses is a
failed line in the error file, and the other lines run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Checked:
    """The input's lines (non-blank), and the file-level errors (none: the batch may run)."""

    total: int
    errors: tuple[dict[str, Any], ...] = ()


def _error(code: str, message: str, line: int | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "line": line, "param": "input_file_id"}


def check_input(path: Path, max_lines: int) -> Checked:
    """One pass over the input file (module doc); it parses lines only until one is a JSON object."""
    total, found_object = 0, False
    if not path.is_file():
        return Checked(0, (_error("missing_file", "the input file is gone (deleted or expired)"),))
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            total += 1
            if total > max_lines:
                message = f"the input file has more than {max_lines} requests (--batch-max-lines)"
                return Checked(total, (_error("too_many_lines", message, number),))
            if not found_object:
                found_object = _is_object(raw)
    if total == 0:
        return Checked(0, (_error("empty_file", "the input file has no lines"),))
    if not found_object:
        message = "no line of the input file is a JSON object: it is not JSONL (one request object a line)"
        return Checked(total, (_error("invalid_file", message),))
    return Checked(total)


def _is_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
