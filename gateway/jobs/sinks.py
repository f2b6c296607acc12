"""Where a job's finished lines go, and how a re-run knows what was finished: the output itself.

A sink opens its files, says which lines are already done (``done``: the
custom_ids, and for a failed line without one its line number, of every
complete line found), and appends each newly finished line once. Nothing
else records progress, so whatever killed the last run (SIGKILL, Ctrl-C, a
gateway restart), the re-run skips exactly the lines that reached the files
and redoes the rest: no line is lost or written twice.

- ``JsonlSink``: the output and the error file as JSONL, appended with one
  ``write`` per line on an ``O_APPEND`` descriptor. A line cut short by a
  kill (a file not ending in a newline) is cut off on open, so it is redone.
  The scan reads only each output line's ``custom_id`` (the lines are written
  with ``id`` then ``custom_id`` first), not its vectors.
- ``ParquetSink``: successes as Parquet (one row per vector, score or label;
  vectors as fixed-size float32 lists), failures as the JSONL error file. Rows
  are written in part files under ``OUTPUT.parts/``, each renamed into place
  only once whole (every ``part_lines`` lines or ``part_s`` seconds), and
  joined into ``OUTPUT`` when the job ends; a re-run reads the parts (or a
  finished ``OUTPUT``) for what is done.
"""

from __future__ import annotations

import base64
import json
import os
import time
from json.decoder import scanstring  # type: ignore[attr-defined]  # (the stubs leave it out)
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from poolgate.gateway.jobs.lines import Line, done_key, dumps, output_line

_OUTPUT_HEAD = b'{"id":"batch_req_'


class Sink(Protocol):
    done: set[str | int]

    def write_ok(self, line: Line, status: int, request_id: str, body: Any) -> None | str:
        """Write a success; a message instead when this sink cannot hold this answer (it is then a failed line)."""
        ...

    def write_error(self, obj: dict[str, Any]) -> None: ...

    def close(self, finished: bool) -> None:
        """Release the files; ``finished``: every line is done (a Parquet sink joins its parts)."""
        ...


def repair_tail(path: Path) -> None:
    """Cut a last line that does not end in a newline (a write a kill cut short)."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        pos = size
        while pos > 0:
            step = min(1 << 16, pos)
            f.seek(pos - step)
            chunk = f.read(step)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                f.truncate(pos - step + cut + 1)
                return
            pos -= step
        f.truncate(0)


def line_key(raw: bytes) -> str | int | None:
    """The done key of one written line; reads only the custom_id of a line in ``output_line``'s layout."""
    if raw.startswith(_OUTPUT_HEAD):
        at = raw.find(b'"custom_id":"', len(_OUTPUT_HEAD))
        if at > 0:
            text = raw[at + 13 : at + 13 + 4 * 512 + 8].decode("utf-8", "ignore")
            try:
                return scanstring(text, 0)[0]
            except ValueError:
                pass
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return done_key(obj) if isinstance(obj, dict) else None


def scan_jsonl(path: Path) -> set[str | int]:
    """The done keys of every complete line of a JSONL file the sinks wrote (after ``repair_tail``)."""
    keys: set[str | int] = set()
    if not path.exists():
        return keys
    repair_tail(path)
    with open(path, "rb") as f:
        for raw in f:
            key = line_key(raw)
            if key is not None:
                keys.add(key)
    return keys


class _Appender:
    """One file appended a whole line per ``write`` (``O_APPEND``, unbuffered)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def close(self) -> None:
        os.close(self.fd)


class JsonlSink:
    """The output and error files as JSONL (module doc)."""

    def __init__(self, output: Path, errors: Path):
        self.done = scan_jsonl(output) | scan_jsonl(errors)
        self._out, self._err = _Appender(output), _Appender(errors)

    def write_ok(self, line: Line, status: int, request_id: str, body: Any) -> None:
        self._out.write(dumps(output_line(line.custom_id, status, request_id, body)))

    def write_error(self, obj: dict[str, Any]) -> None:
        self._err.write(dumps(obj))

    def close(self, finished: bool) -> None:
        self._out.close()
        self._err.close()


# The Parquet rows of each route kind: the url's answer as rows (custom_id, index, ...), one kind per file.
EMBED_URLS = ("/v1/embeddings",)
CLASSIFY_URLS = ("/classify", "/v1/classify")
SCORE_URLS = ("/score", "/v1/score")
RERANK_URLS = ("/rerank", "/v1/rerank", "/v2/rerank")
PARQUET_URLS = EMBED_URLS + CLASSIFY_URLS + SCORE_URLS + RERANK_URLS


def _vector(value: Any) -> np.ndarray:
    """An embedding as the route gave it: a float list or base64 of little-endian float32."""
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value), dtype="<f4")
    return np.asarray(value, dtype=np.float32)


def parquet_rows(url: str, body: dict[str, Any]) -> tuple[str, list[int], dict[str, list]]:
    """(kind, indexes, columns) of one answer; ValueError when the answer cannot be rows of its kind."""
    if url in EMBED_URLS:
        data = body["data"]
        return "embedding", [d["index"] for d in data], {"embedding": [_vector(d["embedding"]) for d in data]}
    if url in CLASSIFY_URLS:
        data = body["data"]
        return (
            "classify",
            [d["index"] for d in data],
            {
                "label": [d.get("label") for d in data],
                "probs": [np.asarray(d["probs"], dtype=np.float32) for d in data],
            },
        )
    if url in SCORE_URLS:
        data = body["data"]
        return "score", [d["index"] for d in data], {"score": [float(d["score"]) for d in data]}
    if url in RERANK_URLS:
        results = body["results"]
        return (
            "rerank",
            [r["index"] for r in results],
            {"relevance_score": [float(r["relevance_score"]) for r in results]},
        )
    raise ValueError(f"Parquet output takes the answers of {', '.join(PARQUET_URLS)}, not {url}")


class ParquetSink:
    """Successes as Parquet part files joined at the end, failures as JSONL (module doc)."""

    def __init__(self, output: Path, errors: Path, *, part_lines: int = 10_000, part_s: float = 10.0):
        import pyarrow as pa  # an extra: only Parquet output needs it
        import pyarrow.parquet as pq

        self.pa, self.pq = pa, pq
        self.output, self.parts = output, output.with_name(output.name + ".parts")
        self.part_lines, self.part_s = part_lines, part_s
        self.parts.mkdir(exist_ok=True)
        if output.exists():  # a finished run's file: it becomes the first part, joined again at the end
            output.rename(self.parts / "part-000000.parquet")
        for tmp in self.parts.glob("*.tmp"):
            tmp.unlink()
        self.kind: str | None = None
        self.width: int | None = None
        self.done = scan_jsonl(errors)
        self._next = 1
        for part in sorted(self.parts.glob("part-*.parquet")):
            self._next = max(self._next, int(part.stem.split("-")[1]) + 1)
            table = pq.read_table(part)
            self.done.update(table.column("custom_id").to_pylist())
            self._learn(table)
        self._err = _Appender(errors)
        self._rows: dict[str, list] = {}
        self._lines = 0
        self._since = time.monotonic()

    def _learn(self, table: Any) -> None:
        names = set(table.column_names)
        kind = next(
            k
            for k, c in (
                ("embedding", "embedding"),
                ("classify", "probs"),
                ("score", "score"),
                ("rerank", "relevance_score"),
            )
            if c in names
        )
        self.kind = kind
        field = table.schema.field({"embedding": "embedding", "classify": "probs"}.get(kind, "custom_id"))
        self.width = getattr(field.type, "list_size", None)

    def write_ok(self, line: Line, status: int, request_id: str, body: Any) -> None | str:
        try:
            kind, indexes, columns = parquet_rows(line.url, body)
        except (KeyError, TypeError, ValueError) as exc:
            return str(exc) if isinstance(exc, ValueError) else f"the answer of {line.url} has no {exc}"
        if self.kind is not None and kind != self.kind:
            return f"this Parquet file holds {self.kind} rows; a {line.url} answer cannot go in it"
        vectors = columns.get("embedding") or columns.get("probs")
        if vectors:
            widths = {len(v) for v in vectors}
            if len(widths) > 1 or (self.width is not None and widths != {self.width}):
                return f"Parquet vectors are fixed-size: {sorted(widths)} values here, {self.width} in the file"
            self.width = widths.pop()
        self.kind = kind
        self._rows.setdefault("custom_id", []).extend([line.custom_id] * len(indexes))
        self._rows.setdefault("index", []).extend(indexes)
        for name, values in columns.items():
            self._rows.setdefault(name, []).extend(values)
        self._lines += 1
        if self._lines >= self.part_lines or time.monotonic() - self._since >= self.part_s:
            self._flush()
        return None

    def write_error(self, obj: dict[str, Any]) -> None:
        self._err.write(dumps(obj))

    def _table(self) -> Any:
        pa, rows = self.pa, self._rows
        columns = {"custom_id": pa.array(rows["custom_id"], pa.string()), "index": pa.array(rows["index"], pa.int32())}
        for name in ("embedding", "probs"):
            if name in rows:
                flat = np.concatenate(rows[name]).astype(np.float32, copy=False)
                columns[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), self.width)
        if "label" in rows:
            columns["label"] = pa.array(rows["label"], pa.string())
        for name in ("score", "relevance_score"):
            if name in rows:
                columns[name] = pa.array(rows[name], pa.float64())
        return pa.table(columns)

    def _flush(self) -> None:
        """Write the rows held as one more part, renamed into place once whole."""
        if self._lines:
            final = self.parts / f"part-{self._next:06d}.parquet"
            tmp = final.with_suffix(".tmp")
            self.pq.write_table(self._table(), tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            tmp.rename(final)
            self._next += 1
        self._rows, self._lines, self._since = {}, 0, time.monotonic()

    def close(self, finished: bool) -> None:
        self._flush()
        self._err.close()
        if not finished:
            return
        parts = sorted(self.parts.glob("part-*.parquet"))
        tmp = self.output.with_name(self.output.name + ".tmp")
        writer = None
        for part in parts:
            table = self.pq.read_table(part)
            if writer is None:
                writer = self.pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
        if writer is not None:
            writer.close()
            tmp.rename(self.output)
        for part in parts:
            part.unlink()
        self.parts.rmdir()
