"""OpenAI's Batch routes: create a batch over an uploaded file, read it, list them, cancel one.

- ``POST /v1/batches`` (``input_file_id``: one of the caller's files of
  purpose ``batch``; ``endpoint``: one of the pooling routes of
  ``gateway.jobs.lines.URLS``, every line must name it; ``completion_window``:
  ``"24h"``; ``metadata``: at most 16 pairs, keys up to 64 and values up to
  512 characters; ``output_expires_after``): a Batch in ``validating``, run in
  the background by the gateway's runner (``gateway.jobs.runner``) and
  expired if not done 24 hours after it was made.
- ``GET /v1/batches/{batch_id}``: the Batch, its ``request_counts`` and
  ``usage`` updated about once a second while it runs.
- ``GET /v1/batches`` (``after``, ``limit`` 1..100 default 20): a cursor page of
  the caller's batches, newest first.
- ``POST /v1/batches/{batch_id}/cancel``: ``cancelling`` at once, ``cancelled``
  once the runner has stopped it (lines in flight are dropped, the lines
  finished so far are in its output and error files); 409 for a batch that is
  finalizing or has ended.

Another tenant's batch, or a batch on another tenant's file, is a 404.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from poolgate.gateway.dialects.route import Route
from poolgate.gateway.jobs.objects import WINDOW_S, BatchCreate, BatchList, BatchListQuery, BatchObject, batch_object
from poolgate.gateway.jobs.service import api_of, batch_off, owner_of
from poolgate.gateway.jobs.store import new_batch_id
from poolgate.shared.domain.errors import InvalidRequest


def _json(model: Any) -> web.Response:
    return web.json_response(model.model_dump(mode="json"))


async def create_batch(request: web.Request, body: BatchCreate) -> web.Response:
    api, owner = api_of(request), owner_of(request)
    now = api.now()
    source = await asyncio.to_thread(api.store.get_file, owner, body.input_file_id, now, "input_file_id")
    if source["purpose"] != "batch":
        raise InvalidRequest(
            f"file {body.input_file_id} has purpose {source['purpose']!r}; a batch reads a file uploaded with "
            "purpose 'batch'",
            param="input_file_id",
        )
    expiry = body.output_expires_after
    row = {
        "id": new_batch_id(),
        "owner": owner,
        "endpoint": body.endpoint,
        "input_file_id": body.input_file_id,
        "completion_window": body.completion_window,
        "status": "validating",
        "created_at": now,
        "expires_at": now + WINDOW_S,
        "output_expires_s": expiry.seconds if expiry is not None else None,
        "metadata": body.metadata,
    }
    created = await asyncio.to_thread(api.store.add_batch, row)
    api.wake.set()
    return _json(batch_object(created))


async def get_batch(request: web.Request, _body: None) -> web.Response:
    api = api_of(request)
    row = await asyncio.to_thread(api.store.batch, request.match_info["batch_id"], owner_of(request))
    return _json(batch_object(row))


async def list_batches(request: web.Request, query: BatchListQuery) -> web.Response:
    api, owner = api_of(request), owner_of(request)
    rows, more = await asyncio.to_thread(lambda: api.store.list_batches(owner, after=query.after, limit=query.limit))
    data = [batch_object(r) for r in rows]
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return _json(BatchList(data=data, first_id=first, last_id=last, has_more=more))


async def cancel_batch(request: web.Request, _body: None) -> web.Response:
    api = api_of(request)
    row = await asyncio.to_thread(api.store.cancel, owner_of(request), request.match_info["batch_id"], api.now())
    api.wake.set()
    return _json(batch_object(row))


ROUTES = (
    Route(
        "POST",
        "/v1/batches",
        create_batch,
        BatchCreate,
        response_model=BatchObject,
        summary="OpenAI Batch: run a file of requests in the background",
        off=batch_off,
    ),
    Route(
        "GET",
        "/v1/batches",
        list_batches,
        query=BatchListQuery,
        response_model=BatchList,
        summary="OpenAI Batch: the caller's batches, newest first",
        off=batch_off,
    ),
    Route(
        "GET",
        "/v1/batches/{batch_id}",
        get_batch,
        response_model=BatchObject,
        summary="OpenAI Batch: one batch",
        off=batch_off,
    ),
    Route(
        "POST",
        "/v1/batches/{batch_id}/cancel",
        cancel_batch,
        response_model=BatchObject,
        summary="OpenAI Batch: cancel a batch",
        off=batch_off,
    ),
)
