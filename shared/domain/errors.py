"""Typed errors: code raises these; the gateway's one middleware maps them to HTTP.

Each class carries its HTTP status and the OpenAI-style ``type``. Workers send
them across the transport by class name (``ERRORS``, every subclass defined
here) with every field (``to_wire``: the message and each keyword-only argument
of ``__init__``, which a class keeps as the attribute of the same name), and the
client raises the same class again with the same fields, so a 400 found in a
worker is a 400 at the gateway and a worker's 429 keeps its ``Retry-After``.
"""

from __future__ import annotations

import inspect
from typing import Any


class PoolgateError(Exception):
    """Base class: ``status``, ``type`` and ``code`` go into the error body."""

    status = 500
    type = "InternalServerError"
    code = "internal_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param

    @classmethod
    def wire_fields(cls) -> tuple[str, ...]:
        """The fields beside the message that cross the transport: ``__init__``'s keyword-only arguments."""
        params = inspect.signature(cls.__init__).parameters.values()
        return tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)

    def fields(self) -> dict[str, Any]:
        """This error's wire fields and their values."""
        return {name: getattr(self, name) for name in self.wire_fields()}

    def copy(self) -> PoolgateError:
        """A new error of this class with the same message and fields (one per failed call)."""
        return type(self)(self.message, **self.fields())

    def to_wire(self) -> dict[str, Any]:
        return {"class": type(self).__name__, "message": self.message, **self.fields()}


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


class ObjectNotFound(RouteNotFound):
    """An object the request names (a file, a batch) that does not exist, or is another tenant's."""


class Overloaded(PoolgateError):
    """Refused for now, worth retrying: ``retry_after_s`` (the ``Retry-After`` header; None: the default)
    and ``reason`` (the refusal metric's label, e.g. ``queue_full``) say when and why."""

    status = 429
    type = "RateLimitError"
    code = "overloaded"

    def __init__(
        self, message: str, *, param: str | None = None, retry_after_s: float | None = None, reason: str = "overloaded"
    ):
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


def _with_subclasses(cls: type[PoolgateError]) -> list[type[PoolgateError]]:
    return [cls] + [sub for direct in cls.__subclasses__() for sub in _with_subclasses(direct)]


# Every error a worker can raise, by class name: all defined above (the workers never import the gateway).
ERRORS: dict[str, type[PoolgateError]] = {cls.__name__: cls for cls in _with_subclasses(PoolgateError)}


def from_wire(body: dict[str, Any]) -> PoolgateError:
    """Rebuild the error a worker sent, with the fields it sent; an unknown class name becomes InternalError,
    a field the class does not take (a newer worker's) is dropped, a missing one keeps its default."""
    cls = ERRORS.get(body.get("class", ""), InternalError)
    fields = {name: body[name] for name in cls.wire_fields() if name in body}
    return cls(str(body.get("message", "worker error")), **fields)
