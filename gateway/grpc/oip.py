"""The Open Inference Protocol's gRPC service (``inference.GRPCInferenceService``) on poolgate's serving path.

The same model view as the REST routes (``dialects.oip_models``: each kind's
tensors, ``infer``, ``model_metadata``) and the same codec
(``dialects.oip_tensors``); only the transport is gRPC's:

- ``ServerLive``: true while the server runs; ``ServerReady``: every model has
  a ready worker; ``ModelReady``: that model has one (an unknown model or
  version: not ready, as Triton answers);
- ``ServerMetadata``: ``poolgate``, its version, the extensions it implements;
- ``ModelMetadata``: the model's tensors (an unknown model: ``NOT_FOUND``);
- ``ModelInfer``: inputs from ``raw_input_contents`` (what tritonclient sends:
  little-endian, BYTES elements length-prefixed) or from each tensor's typed
  ``contents``; the request's and each tensor's ``parameters``; the requested
  outputs (none named: all). Outputs go back in ``raw_output_contents``, one per
  output in order (tritonclient reads FP32 only from there), the request's
  ``id`` echoed.

Triton's other RPCs (statistics, repository, shared memory, trace and log
settings, ``ModelStreamInfer``, ``ModelConfig``) are not served: grpcio answers
``UNIMPLEMENTED``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from poolgate.gateway.dialects.oip import EXTENSIONS
from poolgate.gateway.dialects.oip_models import VERSION, infer, lookup, model_metadata
from poolgate.gateway.dialects.oip_parameters import check_output_parameters
from poolgate.gateway.dialects.oip_tensors import Tensor, dtype_of, from_data, from_raw, to_raw
from poolgate.gateway.grpc.handlers import unary
from poolgate.gateway.grpc.protos import Protos
from poolgate.gateway.http.state import ROUTER
from poolgate.gateway.scope import CallScope
from poolgate.shared.domain.errors import InvalidRequest, PoolgateError
from poolgate.shared.version import VERSION as POOLGATE_VERSION

SERVICE = "inference.GRPCInferenceService"
# datatype -> the InferTensorContents field that carries it
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameter(value: Any) -> Any:
    """An ``InferParameter``'s value (bool, int or str); None when unset."""
    which = value.WhichOneof("parameter_choice")
    return getattr(value, which) if which is not None else None


def parameters(message_map: Any) -> dict[str, Any]:
    return {key: parameter(value) for key, value in message_map.items()}


def input_tensors(request: Any) -> list[Tensor]:
    """The request's inputs (module doc): raw contents for every input, or typed contents for every input."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequest(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs: one per input, in order"
        )
    out = []
    for i, t in enumerate(request.inputs):
        shape = list(t.shape)
        if raw:
            if t.HasField("contents"):
                raise InvalidRequest(f"input '{t.name}' has contents and raw_input_contents: send one", param=t.name)
            tensor = from_raw(t.name, t.datatype, shape, raw[i])
        else:
            field = CONTENTS.get(t.datatype)
            if field is None:
                dtype_of(t.name, t.datatype)  # an unknown or refused datatype: named as such
                raise InvalidRequest(
                    f"input '{t.name}': {t.datatype} has no typed contents field; send it in raw_input_contents",
                    param=t.name,
                )
            else:
                tensor = from_data(t.name, t.datatype, shape, list(getattr(t.contents, field)))
        out.append(Tensor(tensor.name, tensor.datatype, tensor.shape, tensor.data, parameters(t.parameters)))
    return out


class Oip:
    """``inference.GRPCInferenceService`` of one app: ``handlers()`` as ``gateway.grpc.server`` registers them."""

    def __init__(self, app: web.Application, protos: Protos) -> None:
        self.app, self.m = app, protos.message

    async def server_live(self, scope: CallScope, _request: Any) -> Any:
        return self.m("inference.ServerLiveResponse")(live=True)

    async def server_ready(self, scope: CallScope, _request: Any) -> Any:
        return self.m("inference.ServerReadyResponse")(ready=self.app[ROUTER].ready)

    async def model_ready(self, scope: CallScope, request: Any) -> Any:
        try:
            info = lookup(scope, request.name, request.version)
        except PoolgateError:
            return self.m("inference.ModelReadyResponse")(ready=False)
        return self.m("inference.ModelReadyResponse")(ready=self.app[ROUTER].lookup(info.served_model_name).ready)

    async def server_metadata(self, scope: CallScope, _request: Any) -> Any:
        return self.m("inference.ServerMetadataResponse")(
            name="poolgate", version=POOLGATE_VERSION, extensions=list(EXTENSIONS)
        )

    async def model_metadata(self, scope: CallScope, request: Any) -> Any:
        meta = model_metadata(lookup(scope, request.name, request.version))
        spec = self.m("inference.ModelMetadataResponse.TensorMetadata")
        return self.m("inference.ModelMetadataResponse")(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[spec(**s) for s in meta["inputs"]],
            outputs=[spec(**s) for s in meta["outputs"]],
        )

    async def model_infer(self, scope: CallScope, request: Any) -> Any:
        info = lookup(scope, request.model_name, request.model_version)  # unknown: 404 before the tensors
        for out in request.outputs:
            check_output_parameters(out.name, parameters(out.parameters))
        requested = [out.name for out in request.outputs] or None
        outputs = await infer(
            scope,
            info.served_model_name,
            request.model_version,
            input_tensors(request),
            requested,
            parameters(request.parameters),
        )
        tensor = self.m("inference.ModelInferResponse.InferOutputTensor")
        return self.m("inference.ModelInferResponse")(
            model_name=info.served_model_name,
            model_version=VERSION,
            id=request.id,
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=list(t.shape)) for t in outputs],
            raw_output_contents=[to_raw(t) for t in outputs],
        )

    def handlers(self) -> dict[str, dict[str, tuple[str, Any, str, str]]]:
        """service -> method -> (kind, handler, request message, response message), as ``gateway.grpc.tei``."""
        methods = {  # name -> (method, public: no key, recorded) as the REST routes of the same answers
            "ServerLive": (self.server_live, True, False),
            "ServerReady": (self.server_ready, True, False),
            "ModelReady": (self.model_ready, True, False),
            "ServerMetadata": (self.server_metadata, True, False),
            "ModelMetadata": (self.model_metadata, False, False),
            "ModelInfer": (self.model_infer, False, True),
        }
        table = {}
        for name, (fn, public, recorded) in methods.items():
            handler = unary(self.app, f"/{SERVICE}/{name}", f"{name}Request", fn, public=public, recorded=recorded)
            table[name] = ("unary", handler, f"{name}Request", f"{name}Response")
        return {SERVICE: table}
