"""The Open Inference Protocol's REST routes (KServe v2): what tritonclient, NVIDIA NIM's and KServe's clients call.

- ``GET /v2``: ``{name: "poolgate", version, extensions: ["binary_tensor_data"]}``;
- ``GET /v2/health/live`` (200 ``{live: true}``) and ``/v2/health/ready``
  (200 ``{ready: true}`` once every model has a ready worker, as ``/health``;
  else 503); these three are public, like ``/health`` and ``/version``;
- ``GET /v2/models/{name}[/versions/{version}]``: the model's metadata
  (``dialects.oip_models``: its tensors by kind), ``.../ready`` (200 once the
  model has a ready worker, else 503), ``.../config`` (a small Triton model
  configuration, for ``get_model_config``);
- ``POST /v2/models/{name}[/versions/{version}]/infer``: one inference
  (``dialects.oip_body``: JSON, and the binary tensor data extension both ways);
- ``POST /v2/repository/index``: Triton's list of models, ``{"ready": true}``
  for the ready ones only.

A model name may hold slashes (``sentence-transformers/all-MiniLM-L6-v2``:
tritonclient does not escape them), so ``{name}`` (and ``{version}``) take the
rest of the path up to the route's own suffix: a path is always one of these
routes, and answers in the protocol's shape. Triton's other routes that tritonclient calls
(statistics, repository load and unload, shared memory, trace and log
settings) answer 404 saying so. Errors are the protocol's ``{"error": "…"}``.
The model routes need the API key (as ``/v1/models``); only ``infer`` is
counted in the metrics and traced.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, StrictBool

from poolgate.gateway.dialects.body import loads, read_bytes, validated
from poolgate.gateway.dialects.encoding import dumps
from poolgate.gateway.dialects.oip_body import InferRequest, InferResponse, binary_outputs, infer_response, read_infer
from poolgate.gateway.dialects.oip_models import VERSION, infer, lookup, model_config, model_metadata
from poolgate.gateway.dialects.route import Handler, Route
from poolgate.gateway.http.state import ROUTER
from poolgate.shared.domain.errors import RouteNotFound, Unavailable
from poolgate.shared.version import VERSION as POOLGATE_VERSION
from poolgate.shared.wire.messages import ModelInfo

EXTENSIONS = ("binary_tensor_data",)
ANY = r"[\s\S]+"  # any characters, slashes and newlines too (``.`` would leave newlines out)
MODEL = "/v2/models/{name:" + ANY + "}"
VERSIONED = MODEL + "/versions/{version:" + ANY + "}"


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class IndexRequest(BaseModel):
    """Triton's repository index body: ``ready`` true lists only the ready models."""

    model_config = ConfigDict(extra="forbid")
    ready: StrictBool = False


def _json(body: object) -> web.Response:
    return web.Response(body=dumps(body), content_type="application/json")


def _model(request: web.Request) -> ModelInfo:
    return lookup(request, request.match_info["name"], request.match_info.get("version"))


async def server_metadata(request: web.Request, _body: None = None) -> web.Response:
    return _json({"name": "poolgate", "version": POOLGATE_VERSION, "extensions": list(EXTENSIONS)})


async def live(request: web.Request, _body: None = None) -> web.Response:
    return _json({"live": True})


async def ready(request: web.Request, _body: None = None) -> web.Response:
    if not request.app[ROUTER].ready:
        raise Unavailable("Not ready: some model has no ready worker yet.")
    return _json({"ready": True})


async def metadata(request: web.Request, _body: None = None) -> web.Response:
    return _json(model_metadata(_model(request)))


async def model_ready(request: web.Request, _body: None = None) -> web.Response:
    info = _model(request)
    if not request.app[ROUTER].lookup(info.served_model_name).ready:
        raise Unavailable(f"Not ready: the model `{info.served_model_name}` has no ready worker yet.")
    return _json({"name": info.served_model_name, "ready": True})


async def config(request: web.Request, _body: None = None) -> web.Response:
    return _json(model_config(_model(request)))


async def repository_index(request: web.Request, _body: None = None) -> web.Response:
    raw = await read_bytes(request)
    only_ready = validated(loads(raw), IndexRequest).ready if raw.strip() else False
    pools = list(request.app[ROUTER].pools.values())
    return _json(
        [
            {"name": p.name, "version": VERSION, "state": "READY" if p.ready else "UNAVAILABLE", "reason": ""}
            for p in pools
            if p.ready or not only_ready
        ]
    )


async def infer_route(request: web.Request, _body: None = None) -> web.Response:
    name, version = request.match_info["name"], request.match_info.get("version")
    info = lookup(request, name, version)  # an unknown model is a 404 before its body is read
    body, inputs = await read_infer(request)
    binary = binary_outputs(body)
    requested = [out.name for out in body.outputs] if body.outputs is not None else None
    outputs = await infer(request, info.served_model_name, version, inputs, requested, body.parameters or {})
    return infer_response(info.served_model_name, VERSION, body, outputs, binary)


TRITON_ONLY = {
    ("GET", MODEL + "/stats"): "Triton's inference statistics are not implemented: poolgate's metrics are at /metrics",
    ("GET", VERSIONED + "/stats"): "Triton's inference statistics are not implemented: poolgate's metrics are at "
    "/metrics",
    (
        "POST",
        "/v2/repository/models/{name:" + ANY + "}/load",
    ): "Triton's model repository is not implemented: load models with the admin API (POST /admin/models)",
    ("POST", "/v2/repository/models/{name:" + ANY + "}/unload"): "Triton's model repository is not implemented: unload "
    "models with the admin API (DELETE /admin/models/{name})",
    ("GET", "/v2/systemsharedmemory/status"): "shared memory is not implemented: send tensors in the request",
    ("GET", "/v2/cudasharedmemory/status"): "shared memory is not implemented: send tensors in the request",
    ("GET", "/v2/trace/setting"): "Triton's trace settings are not implemented: poolgate traces with OpenTelemetry",
    ("GET", "/v2/logging"): "Triton's log settings are not implemented",
}


def _not_implemented(why: str) -> Handler:
    async def handler(request: web.Request, _body: None = None) -> web.Response:
        raise RouteNotFound(f"{request.method} {request.path}: {why}.")

    return handler


def _route(method: str, path: str, handler: Handler, summary: str, **rules: Any) -> Route:
    return Route(method, path, handler, errors="oip", summary=f"Open Inference Protocol: {summary}", **rules)


# The routes with a fixed suffix come before the bare model routes, whose {name} would take the suffix too.
ROUTES = (
    _route(
        "GET", "/v2", server_metadata, "server metadata", response_model=ServerMetadata, public=True, recorded=False
    ),
    _route("GET", "/v2/health/live", live, "200 while the server runs", public=True, recorded=False),
    _route(
        "GET",
        "/v2/health/ready",
        ready,
        "200 once every model has a ready worker, else 503",
        public=True,
        recorded=False,
        quiet_503=True,
    ),
    *(
        _route(method, path, _not_implemented(why), "Triton-only, not implemented (404)", recorded=False)
        for (method, path), why in TRITON_ONLY.items()
    ),
    _route(
        "POST", "/v2/repository/index", repository_index, "Triton's list of models", framed=IndexRequest, recorded=False
    ),
    *(
        r
        for base in (VERSIONED, MODEL)
        for r in (
            _route(
                "POST",
                base + "/infer",
                infer_route,
                "inference (JSON, or JSON then binary tensor data)",
                framed=InferRequest,
                response_model=InferResponse,
            ),
            _route(
                "GET",
                base + "/ready",
                model_ready,
                "200 once the model has a ready worker, else 503",
                recorded=False,
                quiet_503=True,
            ),
            _route("GET", base + "/config", config, "a small Triton model configuration", recorded=False),
            _route(
                "GET",
                base,
                metadata,
                "model metadata: its input and output tensors",
                response_model=ModelMetadata,
                recorded=False,
            ),
        )
    ),
)
