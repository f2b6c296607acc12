"""The Batch API's records: files and batches in SQLite (``DIR/batches.sqlite3``), their bytes under ``DIR/files/``.

Every method is a plain blocking call on one connection (behind a lock, as
the calls come from ``asyncio.to_thread``'s threads); callers on the event
loop run them with ``asyncio.to_thread``. The database is in WAL mode with a
busy timeout, so the gateway processes of ``--gateway-processes N`` share it:
any process answers the API, the first one runs the jobs. Times are Unix
seconds. Every query of the API names the owner (the caller's tenant), so
another tenant's file or batch is not found (404), never shown.

- ``files``: one row per file, uploaded (purpose ``batch``) or written by a
  batch (``batch_output``); its bytes at ``path(id)``. A file past its
  ``expires_at`` is gone for the API at once, and swept (``expired_files``).
- ``batches``: one row per batch: its status and the times it reached each,
  the input file, the ids its output and error files will have
  (``output_path_id``, ``error_path_id``: reserved when it starts, made Files
  when it ends), its request counts, input tokens, model and file-level
  errors (JSON), its metadata (JSON).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, get_args

from poolgate.shared.domain.errors import Conflict, InvalidRequest, ObjectNotFound

DB_NAME = "batches.sqlite3"
FILES = "files"
UPLOAD_PREFIX = ".upload-"  # a file being uploaded, renamed to its id once whole
STALE_UPLOAD_S = 3600.0  # an upload temp file this old is left over from a killed process
BUSY_TIMEOUT_MS = 10_000
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")  # a batch not yet in a final status
Status = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"]
STATUSES: tuple[str, ...] = get_args(Status)

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER
);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner, seq);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    in_progress_at INTEGER, expires_at INTEGER, finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER,
    expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,
    output_file_id TEXT, error_file_id TEXT, output_path_id TEXT, error_path_id TEXT,
    output_expires_s INTEGER,
    errors TEXT,
    total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    model TEXT,
    metadata TEXT
);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner, seq);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status, seq);
"""

Row = dict[str, Any]


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


class StorageFull(Exception):
    """The owner's files would pass its storage cap: ``used`` bytes are taken already."""

    def __init__(self, used: int):
        super().__init__(used)
        self.used = used


class Store:
    """The files and batches of one ``--batch-dir`` (module doc)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.files = self.folder / FILES
        self.files.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.folder, 0o700)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.folder / DB_NAME, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000
        )
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self._db.executescript(SCHEMA)
        for stale in self.files.glob(f"{UPLOAD_PREFIX}*"):
            if time.time() - stale.stat().st_mtime > STALE_UPLOAD_S:
                stale.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def path(self, file_id: str) -> Path:
        """Where a file's bytes are (ids are ours: letters, digits, ``-`` and ``_`` only)."""
        if not file_id.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"not a file id: {file_id!r}")
        return self.files / file_id

    def upload_path(self) -> Path:
        return self.files / f"{UPLOAD_PREFIX}{uuid.uuid4().hex}"

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (``BEGIN IMMEDIATE``), so a check and its write are one step
        across the gateway processes too."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _all(self, sql: str, *args: Any) -> list[Row]:
        with self._lock:
            return [dict(r) for r in self._db.execute(sql, args).fetchall()]

    def _one(self, sql: str, *args: Any) -> Row | None:
        rows = self._all(sql, *args)
        return rows[0] if rows else None

    # --- files ----------------------------------------------------------------------------------------------

    def add_file(self, row: Row, cap: int | None, now: int) -> Row:
        """Insert a file row (its bytes are in place); ``StorageFull`` when the owner's live files and this one
        would pass ``cap``."""
        with self._tx() as db:
            if cap is not None:
                used = self._used(db, row["owner"], now)
                if used + row["bytes"] > cap:
                    raise StorageFull(used)
            db.execute(
                "INSERT INTO files (id, owner, purpose, filename, bytes, created_at, expires_at) "
                "VALUES (:id, :owner, :purpose, :filename, :bytes, :created_at, :expires_at)",
                row,
            )
        return row

    @staticmethod
    def _used(db: sqlite3.Connection, owner: str, now: int) -> int:
        sql = "SELECT COALESCE(SUM(bytes), 0) FROM files WHERE owner = ? AND (expires_at IS NULL OR expires_at > ?)"
        return int(db.execute(sql, (owner, now)).fetchone()[0])

    def used_bytes(self, owner: str, now: int) -> int:
        with self._lock:
            return self._used(self._db, owner, now)

    def get_file(self, owner: str, file_id: str, now: int, param: str = "file_id") -> Row:
        row = self._one(
            "SELECT * FROM files WHERE id = ? AND owner = ? AND (expires_at IS NULL OR expires_at > ?)",
            file_id,
            owner,
            now,
        )
        if row is None:
            raise ObjectNotFound(f"No such File object: {file_id}", param=param)
        return row

    def list_files(
        self, owner: str, now: int, *, purpose: str | None, after: str | None, limit: int, order: str
    ) -> tuple[list[Row], bool]:
        """A page of the owner's live files in ``order`` of creation, after the file ``after``; and whether
        more follow."""
        where, args = ["owner = ?", "(expires_at IS NULL OR expires_at > ?)"], [owner, now]
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        if after is not None:
            cursor = self._one("SELECT seq FROM files WHERE id = ? AND owner = ?", after, owner)
            if cursor is None:
                raise InvalidRequest(f"after: no file {after!r} (deleted, or not yours)", param="after")
            where.append("seq < ?" if order == "desc" else "seq > ?")
            args.append(cursor["seq"])
        sql = f"SELECT * FROM files WHERE {' AND '.join(where)} ORDER BY seq {order.upper()} LIMIT ?"
        rows = self._all(sql, *args, limit + 1)
        return rows[:limit], len(rows) > limit

    def delete_file(self, owner: str, file_id: str, now: int) -> None:
        """Remove a file's row (the caller removes its bytes); 409 while a batch not yet ended reads it."""
        with self._tx() as db:
            sql = "SELECT 1 FROM files WHERE id = ? AND owner = ? AND (expires_at IS NULL OR expires_at > ?)"
            if db.execute(sql, (file_id, owner, now)).fetchone() is None:
                raise ObjectNotFound(f"No such File object: {file_id}", param="file_id")
            marks = ",".join("?" * len(ACTIVE))
            reader = db.execute(
                f"SELECT id, status FROM batches WHERE input_file_id = ? AND status IN ({marks}) LIMIT 1",
                (file_id, *ACTIVE),
            ).fetchone()
            if reader is not None:
                raise Conflict(
                    f"File {file_id} is the input of batch {reader['id']}, which is {reader['status']}; "
                    "cancel it or let it end first.",
                    param="file_id",
                )
            db.execute("DELETE FROM files WHERE id = ?", (file_id,))

    def expired_files(self, now: int) -> list[str]:
        """Remove the rows of the files past their expiry that no batch not yet ended reads; their ids."""
        marks = ",".join("?" * len(ACTIVE))
        with self._tx() as db:
            ids = [
                r[0]
                for r in db.execute(
                    "SELECT id FROM files WHERE expires_at IS NOT NULL AND expires_at <= ? AND id NOT IN "
                    f"(SELECT input_file_id FROM batches WHERE status IN ({marks}))",
                    (now, *ACTIVE),
                ).fetchall()
            ]
            db.executemany("DELETE FROM files WHERE id = ?", [(i,) for i in ids])
        return ids

    # --- batches --------------------------------------------------------------------------------------------

    def add_batch(self, row: Row) -> Row:
        stored = {**row, "metadata": json.dumps(row["metadata"]) if row["metadata"] is not None else None}
        names = ", ".join(stored)
        with self._tx() as db:
            db.execute(f"INSERT INTO batches ({names}) VALUES ({', '.join(':' + n for n in stored)})", stored)
        return self.batch(row["id"])

    def batch(self, batch_id: str, owner: str | None = None) -> Row:
        """A batch (only the owner's, when given); 404 when there is none."""
        if owner is None:
            row = self._one("SELECT * FROM batches WHERE id = ?", batch_id)
        else:
            row = self._one("SELECT * FROM batches WHERE id = ? AND owner = ?", batch_id, owner)
        if row is None:
            raise ObjectNotFound(f"No such Batch object: {batch_id}", param="batch_id")
        return row

    def list_batches(self, owner: str, *, after: str | None, limit: int) -> tuple[list[Row], bool]:
        """A page of the owner's batches, newest first, after the batch ``after``; and whether more follow."""
        where, args = ["owner = ?"], [owner]
        if after is not None:
            cursor = self._one("SELECT seq FROM batches WHERE id = ? AND owner = ?", after, owner)
            if cursor is None:
                raise InvalidRequest(f"after: no batch {after!r}", param="after")
            where.append("seq < ?")
            args.append(cursor["seq"])
        rows = self._all(
            f"SELECT * FROM batches WHERE {' AND '.join(where)} ORDER BY seq DESC LIMIT ?", *args, limit + 1
        )
        return rows[:limit], len(rows) > limit

    def active(self) -> list[Row]:
        """Every batch not yet in a final status, oldest first (the order they run in)."""
        marks = ",".join("?" * len(ACTIVE))
        return self._all(f"SELECT * FROM batches WHERE status IN ({marks}) ORDER BY seq", *ACTIVE)

    def move(self, batch_id: str, from_: tuple[str, ...], **fields: Any) -> bool:
        """Set ``fields`` (``status`` among them, for a transition) if the batch's status is one of ``from_``;
        whether it was (the one step that decides a race between, say, a cancel and the end of the job)."""
        with self._tx() as db:
            return self._moved(db, batch_id, from_, fields)

    @staticmethod
    def _moved(db: sqlite3.Connection, batch_id: str, from_: tuple[str, ...], fields: dict[str, Any]) -> bool:
        if fields.get("errors") is not None:
            fields = {**fields, "errors": json.dumps(fields["errors"])}
        sets = ", ".join(f"{name} = :{name}" for name in fields)
        marks = ", ".join(f":s{i}" for i in range(len(from_)))
        args = {**fields, "id": batch_id, **{f"s{i}": s for i, s in enumerate(from_)}}
        return db.execute(f"UPDATE batches SET {sets} WHERE id = :id AND status IN ({marks})", args).rowcount == 1

    def cancel(self, owner: str, batch_id: str, now: int) -> Row:
        """Ask a validating or in_progress batch to stop (``cancelling``); a batch already cancelling stays so;
        409 for one that is finalizing or ended."""
        row = self.batch(batch_id, owner)
        if row["status"] == "cancelling" or self.move(
            batch_id, ("validating", "in_progress"), status="cancelling", cancelling_at=now
        ):
            return self.batch(batch_id)
        status = self.batch(batch_id)["status"]
        raise Conflict(f"Batch {batch_id} is {status}; only a validating or in_progress batch can be cancelled.")

    def finish(self, batch_id: str, from_: tuple[str, ...], files: list[Row], **fields: Any) -> bool:
        """Register the batch's output and error ``files`` and ``move`` it, in one transaction."""
        with self._tx() as db:
            if not self._moved(db, batch_id, from_, fields):
                return False
            db.executemany(
                "INSERT OR REPLACE INTO files (id, owner, purpose, filename, bytes, created_at, expires_at) "
                "VALUES (:id, :owner, :purpose, :filename, :bytes, :created_at, :expires_at)",
                files,
            )
            return True

    def counts_by_status(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) FROM batches GROUP BY status").fetchall()
        return {status: int(n) for status, n in rows}
