"""OpenAI's Files routes for the Batch API: upload, list, retrieve, read and delete the caller's files.

- ``POST /v1/files`` (multipart/form-data: ``file``, ``purpose``, optional
  ``expires_after[anchor]=created_at`` and ``expires_after[seconds]`` in
  3600..2592000): only ``purpose=batch`` is taken (another purpose is a 400
  naming it: this gateway keeps files for batches only). The file is streamed
  to disk (``gateway.jobs.uploads``) with ``--batch-max-file-mb`` and what is
  left of the tenant's ``--batch-tenant-mb`` enforced while it is read (413
  past either). A ``batch`` file expires after 30 days unless
  ``expires_after`` says otherwise, as at OpenAI.
- ``GET /v1/files`` (``purpose``, ``limit`` 1..10,000 default 10,000,
  ``order`` asc/desc by creation, default desc, ``after`` a file id): a cursor
  page ``{object: "list", data, first_id, last_id, has_more}``.
- ``GET /v1/files/{file_id}``: the File object; ``GET /v1/files/{file_id}/content``:
  its bytes, streamed from disk; ``DELETE /v1/files/{file_id}``: ``{id, object,
  deleted}`` (409 while a batch not yet ended reads it).

A file of another tenant, or past its expiry, is a 404 like one that never was.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from poolgate.gateway.dialects.route import Route
from poolgate.gateway.jobs import uploads
from poolgate.gateway.jobs.objects import (
    MAX_EXPIRY_S,
    MIN_EXPIRY_S,
    FileDeleted,
    FileList,
    FileListQuery,
    FileObject,
    FileUpload,
    file_object,
)
from poolgate.gateway.jobs.service import api_of, batch_off, owner_of
from poolgate.gateway.jobs.store import StorageFull, new_file_id
from poolgate.shared.domain.errors import InvalidRequest, RequestTooLarge

MB = 1024 * 1024
UPLOAD_PURPOSE = "batch"
DEFAULT_BATCH_FILE_S = 30 * 24 * 3600  # OpenAI: batch files expire after 30 days by default
EXPIRY_FIELDS = ("expires_after[anchor]", "expires_after[seconds]")


def _json(model: Any, status: int = 200) -> web.Response:
    return web.json_response(model.model_dump(mode="json"), status=status)


async def upload_file(request: web.Request, _body: None) -> web.Response:
    api, owner = api_of(request), owner_of(request)
    store, config, now = api.store, api.config, api.now()
    limit, says = config.max_file_bytes, f"the largest file this gateway takes, {config.max_file_bytes // MB} MB"
    if config.tenant_bytes is not None:
        left = config.tenant_bytes - await asyncio.to_thread(store.used_bytes, owner, now)
        if left < limit:
            limit, says = max(0, left), _storage_full(owner, config.tenant_bytes, config.tenant_bytes - left)
    temp = store.upload_path()
    upload = await uploads.receive(request, "file", frozenset({"purpose", *EXPIRY_FIELDS}), temp, limit, says)
    try:
        row = _file_row(upload, owner, now)
        final = store.path(row["id"])
        await asyncio.to_thread(temp.rename, final)
        try:
            await asyncio.to_thread(store.add_file, row, config.tenant_bytes, now)
        except BaseException as exc:
            await asyncio.shield(asyncio.to_thread(final.unlink, True))
            if isinstance(exc, StorageFull):  # another upload of the tenant's took the room meanwhile
                full = _storage_full(owner, config.tenant_bytes, exc.used)
                raise RequestTooLarge(f"The file is over {full}.") from None
            raise
    finally:
        await asyncio.to_thread(temp.unlink, True)
    return _json(file_object(row))


def _storage_full(owner: str, cap: int | None, used: int) -> str:
    return f"what is left of tenant {owner!r}'s storage ({used // MB} of {(cap or 0) // MB} MB used, --batch-tenant-mb)"


def _file_row(upload: uploads.Upload, owner: str, now: int) -> dict[str, Any]:
    """The row of an uploaded file; 400 for a purpose other than ``batch`` or a bad ``expires_after``."""
    purpose = upload.fields.get("purpose")
    if purpose is None:
        raise InvalidRequest("the form has no 'purpose' field; this gateway takes purpose 'batch'", param="purpose")
    if purpose != UPLOAD_PURPOSE:
        raise InvalidRequest(
            f"purpose {purpose!r} is not served here: this gateway keeps files for the Batch API only "
            f"(purpose '{UPLOAD_PURPOSE}')",
            param="purpose",
        )
    return {
        "id": new_file_id(),
        "owner": owner,
        "purpose": purpose,
        "filename": upload.filename,
        "bytes": upload.size,
        "created_at": now,
        "expires_at": now + _expiry_s(upload.fields),
    }


def _expiry_s(fields: dict[str, str]) -> int:
    """``expires_after``'s seconds (OpenAI's form fields), or the default of a batch file."""
    anchor, seconds = (fields.get(name) for name in EXPIRY_FIELDS)
    if anchor is None and seconds is None:
        return DEFAULT_BATCH_FILE_S
    if anchor != "created_at":
        raise InvalidRequest("expires_after[anchor] must be 'created_at'", param="expires_after")
    if seconds is None or not seconds.isdigit() or not MIN_EXPIRY_S <= int(seconds) <= MAX_EXPIRY_S:
        raise InvalidRequest(
            f"expires_after[seconds] must be a whole number from {MIN_EXPIRY_S} to {MAX_EXPIRY_S}, got {seconds!r}",
            param="expires_after",
        )
    return int(seconds)


async def list_files(request: web.Request, query: FileListQuery) -> web.Response:
    api, owner, now = api_of(request), owner_of(request), api_of(request).now()
    rows, more = await asyncio.to_thread(
        lambda: api.store.list_files(
            owner, now, purpose=query.purpose, after=query.after, limit=query.limit, order=query.order
        )
    )
    data = [file_object(r) for r in rows]
    page = FileList(
        data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None, has_more=more
    )
    return _json(page)


async def get_file(request: web.Request, _body: None) -> web.Response:
    api = api_of(request)
    row = await asyncio.to_thread(api.store.get_file, owner_of(request), request.match_info["file_id"], api.now())
    return _json(file_object(row))


async def file_content(request: web.Request, _body: None) -> web.StreamResponse:
    api = api_of(request)
    row = await asyncio.to_thread(api.store.get_file, owner_of(request), request.match_info["file_id"], api.now())
    stream = await asyncio.to_thread(open, api.store.path(row["id"]), "rb")
    # a body from an open file: aiohttp streams it in blocks read off the event loop, and closes it
    return web.Response(body=stream, content_type="application/octet-stream")


async def delete_file(request: web.Request, _body: None) -> web.Response:
    api, file_id = api_of(request), request.match_info["file_id"]
    await asyncio.to_thread(api.store.delete_file, owner_of(request), file_id, api.now())
    await asyncio.to_thread(api.store.path(file_id).unlink, True)
    return _json(FileDeleted(id=file_id, deleted=True))


ROUTES = (
    Route(
        "POST",
        "/v1/files",
        upload_file,
        form=FileUpload,
        response_model=FileObject,
        summary="OpenAI Files: upload a batch input file (JSONL)",
        off=batch_off,
    ),
    Route(
        "GET",
        "/v1/files",
        list_files,
        query=FileListQuery,
        response_model=FileList,
        summary="OpenAI Files: the caller's files",
        off=batch_off,
    ),
    Route(
        "GET",
        "/v1/files/{file_id}",
        get_file,
        response_model=FileObject,
        summary="OpenAI Files: one file",
        off=batch_off,
    ),
    Route(
        "GET",
        "/v1/files/{file_id}/content",
        file_content,
        summary="OpenAI Files: a file's bytes",
        off=batch_off,
    ),
    Route(
        "DELETE",
        "/v1/files/{file_id}",
        delete_file,
        response_model=FileDeleted,
        summary="OpenAI Files: delete a file",
        off=batch_off,
    ),
)
