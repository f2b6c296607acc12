"""Typed errors: code raises these; the gateway's one middleware maps them to HTTP.

Each class carries its HTTP status and the OpenAI-style ``type``. Workers send
them across the transport by class name (``ERRORS``) and the client raises the
same class again, so a 400 found in a worker is a 400 at the gateway.
"""
from __future__ import annotations


class PoolgateError(Exception):
    """Base class: ``status``, ``type`` and ``code`` go into the error body."""

    status = 500
    type = "InternalServerError"
    code = "internal_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param

    def to_wire(self) -> dict:
        return {"class": type(self).__name__, "message": self.message, "param": self.param}


class InvalidRequest(PoolgateError):
    status = 400
    type = "BadRequestError"
    code = "invalid_request"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class Unauthorized(PoolgateError):
    status = 401
    type = "AuthenticationError"
    code = "invalid_api_key"


class Forbidden(PoolgateError):
    """Authenticated, but not allowed (the admin API without an API key, a model path outside the roots)."""

    status = 403
    type = "PermissionDeniedError"
    code = "forbidden"


class Conflict(PoolgateError):
    """The request clashes with the server's state (loading a model that is already served)."""

    status = 409
    type = "ConflictError"
    code = "conflict"


class RequestTooLarge(PoolgateError):
    """The request body is over ``--max-request-bytes``."""

    status = 413
    type = "RequestEntityTooLargeError"  # as aiohttp's own 413 answered before
    code = "request_entity_too_large"


class ModelNotFound(PoolgateError):
    status = 404
    type = "NotFoundError"
    code = "model_not_found"


class RouteNotFound(PoolgateError):
    status = 404
    type = "NotFoundError"
    code = "not_found"


class Overloaded(PoolgateError):
    """Refused for now, worth retrying: ``retry_after_s`` (the ``Retry-After`` header; None: the default)
    and ``reason`` (the refusal metric's label, e.g. ``queue_full``) say when and why."""

    status = 429
    type = "RateLimitError"
    code = "overloaded"

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: float | None = None,
                 reason: str = "overloaded"):
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s
        self.reason = reason


class NotSupported(PoolgateError):
    status = 501
    type = "NotImplementedError"
    code = "not_implemented"


class ClientClosedRequest(PoolgateError):
    """The client went away before the answer was written (never sent; for telemetry)."""

    status = 499
    type = "ClientClosedRequest"
    code = "client_closed_request"


class Unavailable(PoolgateError):
    status = 503
    type = "ServiceUnavailableError"
    code = "unavailable"


class DeadlineExceeded(PoolgateError):
    """The request's deadline passed before it ran; the worker itself is fine."""

    status = 504
    type = "GatewayTimeoutError"
    code = "deadline_exceeded"


class InternalError(PoolgateError):
    pass


ERRORS: dict[str, type[PoolgateError]] = {
    cls.__name__: cls
    for cls in (
        PoolgateError, InvalidRequest, ContextLengthExceeded, Unauthorized, Forbidden, Conflict, RequestTooLarge,
        ModelNotFound,
        RouteNotFound, Overloaded, NotSupported, Unavailable, DeadlineExceeded, InternalError, ClientClosedRequest,
    )
}


def from_wire(body: dict) -> PoolgateError:
    """Rebuild the error a worker sent; unknown class names become InternalError."""
    cls = ERRORS.get(body.get("class", ""), InternalError)
    return cls(str(body.get("message", "worker error")), param=body.get("param"))
