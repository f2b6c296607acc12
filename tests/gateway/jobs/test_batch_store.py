"""The Batch API's store on its own: a status moves only from the statuses it names (a cancel and the end of a batch
cannot both win), a file a batch still reads is neither deleted nor swept, the tenant cap is one step, and a second
process sees the same rows."""
from __future__ import annotations

import pytest

from poolgate.gateway.jobs.store import StorageFull, Store, new_batch_id, new_file_id
from poolgate.shared.domain.errors import Conflict, ObjectNotFound

NOW = 1_800_000_000


def a_file(store: Store, owner: str = "a", size: int = 10, expires_at: int | None = None) -> str:
    row = {"id": new_file_id(), "owner": owner, "purpose": "batch", "filename": "in.jsonl", "bytes": size,
           "created_at": NOW, "expires_at": expires_at}
    store.path(row["id"]).write_bytes(b"x" * size)
    store.add_file(row, None, NOW)
    return row["id"]


def a_batch(store: Store, file_id: str, owner: str = "a") -> str:
    row = {"id": new_batch_id(), "owner": owner, "endpoint": "/v1/embeddings", "input_file_id": file_id,
           "completion_window": "24h", "status": "validating", "created_at": NOW, "expires_at": NOW + 86400,
           "output_expires_s": None, "metadata": None}
    return store.add_batch(row)["id"]


def test_a_status_moves_only_from_the_statuses_named(tmp_path):
    store = Store(tmp_path)
    batch = a_batch(store, a_file(store))
    assert store.move(batch, ("validating",), status="in_progress", in_progress_at=NOW)
    assert store.cancel("a", batch, NOW)["status"] == "cancelling"
    assert not store.move(batch, ("in_progress",), status="finalizing")  # the cancel won
    assert store.cancel("a", batch, NOW)["status"] == "cancelling"  # asked twice: still cancelling
    assert store.finish(batch, ("cancelling",), [], status="cancelled", cancelled_at=NOW)
    with pytest.raises(Conflict, match="cancelled"):
        store.cancel("a", batch, NOW)
    with pytest.raises(ObjectNotFound):
        store.cancel("b", batch, NOW)  # another tenant's batch is not found


def test_a_file_a_batch_reads_is_neither_deleted_nor_swept(tmp_path):
    store = Store(tmp_path)
    file_id = a_file(store, expires_at=NOW + 10)
    batch = a_batch(store, file_id)
    with pytest.raises(Conflict, match=batch):
        store.delete_file("a", file_id, NOW)
    assert store.expired_files(NOW + 20) == []  # expired, but its batch has not ended
    store.finish(batch, ("validating",), [], status="failed", failed_at=NOW)
    assert store.expired_files(NOW + 20) == [file_id]
    with pytest.raises(ObjectNotFound):
        store.get_file("a", file_id, NOW)


def test_the_tenant_cap_counts_only_live_files_of_that_tenant(tmp_path):
    store = Store(tmp_path)
    a_file(store, "a", 600)
    a_file(store, "a", 300, expires_at=NOW + 5)
    a_file(store, "b", 900)
    row = {"id": new_file_id(), "owner": "a", "purpose": "batch", "filename": "f", "bytes": 200,
           "created_at": NOW, "expires_at": None}
    with pytest.raises(StorageFull) as full:
        store.add_file(dict(row), 1000, NOW)
    assert full.value.used == 900
    store.add_file(row, 1000, NOW + 10)  # the 300 expired meanwhile
    assert store.used_bytes("a", NOW + 10) == 800


def test_two_processes_share_the_rows(tmp_path):
    first, second = Store(tmp_path), Store(tmp_path)
    batch = a_batch(first, a_file(first))
    assert second.cancel("a", batch, NOW)["status"] == "cancelling"
    assert [r["id"] for r in first.active()] == [batch] and first.batch(batch)["status"] == "cancelling"
    assert first.counts_by_status() == {"cancelling": 1}


def test_ids_are_the_stores_own(tmp_path):
    store = Store(tmp_path)
    for bad in ("../batches.sqlite3", "a/b", ""):
        with pytest.raises(ValueError):
            store.path(bad)
