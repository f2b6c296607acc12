"""Typed errors to gRPC status codes: one table, read for every gRPC answer poolgate gives.

The serving path raises the same ``PoolgateError`` for a gRPC call as for an
HTTP request; its HTTP status picks the code (googleapis' ``google/rpc/code.proto``
mapping, and TEI's own choices where TEI differs: 422 and 424). A 429 is
``RESOURCE_EXHAUSTED`` with when to retry twice over: ``google.rpc.RetryInfo``
in the ``grpc-status-details-bin`` trailer (``google.rpc.Status``, what gRPC's
richer-error clients read) and a ``retry-after`` trailer in whole seconds (as
HTTP's header). Every answer carries ``x-request-id``.
"""

from __future__ import annotations

import math

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from poolgate.shared.domain.errors import PoolgateError

# HTTP status of a PoolgateError -> the gRPC code it answers as
CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ALREADY_EXISTS,
    413: grpc.StatusCode.INVALID_ARGUMENT,  # over a size limit the request chose (inputs, bytes)
    422: grpc.StatusCode.INVALID_ARGUMENT,  # TEI: validation
    424: grpc.StatusCode.FAILED_PRECONDITION,  # TEI: the backend failed
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# gRPC code -> the HTTP status it stands for in the request metrics (the other way round)
HTTP_OF: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
}
DEFAULT_RETRY_S = 1


def code_of(err: PoolgateError) -> grpc.StatusCode:
    """The gRPC code of ``err``: its status in ``CODES``, else INVALID_ARGUMENT for a 4xx, INTERNAL for a 5xx."""
    return CODES.get(err.status, grpc.StatusCode.INVALID_ARGUMENT if err.status < 500 else grpc.StatusCode.INTERNAL)


def retry_after_s(err: PoolgateError) -> int:
    seconds = getattr(err, "retry_after_s", None)
    return max(1, math.ceil(seconds)) if seconds is not None else DEFAULT_RETRY_S


def trailers(err: PoolgateError, request_id: str) -> tuple[tuple[str, str | bytes], ...]:
    """The trailing metadata of a call that failed with ``err``."""
    out: list[tuple[str, str | bytes]] = [("x-request-id", request_id)]
    if err.status == 429:
        seconds = retry_after_s(err)
        info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=seconds))
        detail = any_pb2.Any()
        detail.Pack(info)
        status = status_pb2.Status(code=code_of(err).value[0], message=err.message, details=[detail])
        out += [("retry-after", str(seconds)), ("grpc-status-details-bin", status.SerializeToString())]
    return tuple(out)
