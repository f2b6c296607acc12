"""The Open Inference Protocol's REST inference bodies, JSON or JSON then binary tensor data, read and written.

A request body is JSON, or, when the ``Inference-Header-Content-Length``
header is present, that many bytes of JSON followed by the raw tensors of the
inputs whose ``parameters.binary_data_size`` says their byte length, in input
order (``dialects.oip_tensors.from_raw``); an input has either ``data`` or a
``binary_data_size``, and every byte after the JSON belongs to one input. No
content type is required (tritonclient sends none); the body counts against
``--max-request-bytes`` (413).

A response output is binary when its requested output says
``parameters.binary_data: true``, else when the request says
``parameters.binary_data_output: true`` (what tritonclient sends when it names
no outputs); then the response is the JSON (its length in the response's
``Inference-Header-Content-Length``) followed by those outputs' raw bytes, each
output's length in its ``parameters.binary_data_size``, and it has no
``data``. Otherwise the response is plain JSON with each output's ``data``.
The request's ``id`` comes back as the response's.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from poolgate.gateway.dialects.body import loads, read_bytes, validated
from poolgate.gateway.dialects.encoding import dumps
from poolgate.gateway.dialects.oip_parameters import check_output_parameters
from poolgate.gateway.dialects.oip_tensors import Tensor, from_data, from_raw, to_data, to_raw
from poolgate.shared.domain.errors import InvalidRequest

HEADER_LENGTH = "Inference-Header-Content-Length"
Parameter = StrictBool | StrictInt | StrictFloat | StrictStr
Parameters = dict[str, Parameter]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestInput(_Strict):
    name: StrictStr
    shape: list[Annotated[StrictInt, Field(ge=0)]]
    datatype: StrictStr
    parameters: Parameters | None = None
    data: list[Any] | None = Field(None, description="Row-major values (may be nested); BYTES as strings")


class RequestOutput(_Strict):
    name: StrictStr
    parameters: Parameters | None = None


class InferRequest(_Strict):
    """An inference request's JSON (the binary tensor data that may follow it is not JSON)."""

    id: StrictStr | None = None
    parameters: Parameters | None = None
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] | None = None


class ResponseOutput(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    parameters: Parameters | None = None
    data: list[Any] | None = None


class InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[ResponseOutput]


def header_length(request: web.Request, size: int) -> int | None:
    """The JSON part's length from ``Inference-Header-Content-Length`` (None: the whole body is JSON)."""
    value = request.headers.get(HEADER_LENGTH)
    if value is None:
        return None
    if not value.strip().isdigit() or int(value) > size:
        raise InvalidRequest(
            f"{HEADER_LENGTH} must be the JSON part's length in bytes (at most the body's {size}), got {value[:40]!r}",
            param=HEADER_LENGTH,
        )
    return int(value)


async def read_infer(request: web.Request) -> tuple[InferRequest, list[Tensor]]:
    """The request's JSON and its input tensors, each with its own parameters (module doc)."""
    raw = await read_bytes(request)
    n = header_length(request, len(raw))
    body = validated(loads(raw if n is None else memoryview(raw)[:n]), InferRequest)
    binary = memoryview(raw)[len(raw) if n is None else n :]
    tensors, at = [], 0
    for spec in body.inputs:
        parameters = dict(spec.parameters or {})
        size = parameters.get("binary_data_size")
        if size is None:
            if spec.data is None:
                raise InvalidRequest(f"input '{spec.name}' has no data and no binary_data_size", param=spec.name)
            t = from_data(spec.name, spec.datatype, spec.shape, spec.data)
        else:
            if spec.data is not None:
                raise InvalidRequest(f"input '{spec.name}' has both data and binary_data_size", param=spec.name)
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or at + size > len(binary):
                raise InvalidRequest(
                    f"input '{spec.name}': binary_data_size {size!r} is not within the {len(binary) - at} "
                    "bytes of binary data left",
                    param=spec.name,
                )
            t = from_raw(spec.name, spec.datatype, spec.shape, binary[at : at + size])
            at += size
        tensors.append(Tensor(t.name, t.datatype, t.shape, t.data, parameters))
    if at != len(binary):
        raise InvalidRequest(f"{len(binary) - at} bytes of binary data after the JSON belong to no input")
    for out in body.outputs or ():
        check_output_parameters(out.name, out.parameters or {})
    return body, tensors


def binary_outputs(body: InferRequest) -> dict[str, bool]:
    """Which outputs are answered as binary data (module doc); ``""``: the default for outputs not named."""
    default = (body.parameters or {}).get("binary_data_output", False)
    if not isinstance(default, bool):
        raise InvalidRequest("parameter 'binary_data_output' must be a boolean", param="binary_data_output")
    chosen = {"": default}
    for out in body.outputs or ():
        flag = (out.parameters or {}).get("binary_data", default)
        if not isinstance(flag, bool):
            raise InvalidRequest(f"output '{out.name}': binary_data must be a boolean", param="binary_data")
        chosen[out.name] = flag
    return chosen


def _json_data(t: Tensor) -> Any:
    """``t``'s JSON data: numbers straight from the array (``dumps`` writes them), else Python values."""
    if t.data.dtype.kind in "iuf":
        return np.ascontiguousarray(t.data).ravel()
    return to_data(t)


def infer_response(
    model: str, version: str, body: InferRequest, outputs: list[Tensor], binary: dict[str, bool]
) -> web.Response:
    """The response to ``body``: JSON, or JSON followed by the ``binary`` outputs (``binary_outputs``)."""
    entries, chunks = [], []
    for t in outputs:
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if binary.get(t.name, binary[""]):
            chunk = to_raw(t)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            entry["data"] = _json_data(t)
        entries.append(entry)
    head = dumps(
        {
            "model_name": model,
            "model_version": version,
            **({"id": body.id} if body.id is not None else {}),
            "outputs": entries,
        }
    )
    if not chunks:
        return web.Response(body=head, content_type="application/json")
    return web.Response(
        body=head + b"".join(chunks),
        content_type="application/octet-stream",
        headers={HEADER_LENGTH: str(len(head))},
    )
