"""Error bodies by shape name: what ``Route.errors`` names, and aiohttp's own HTTP exceptions as PoolgateErrors."""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus

from aiohttp import web

from poolgate.shared.domain.errors import PoolgateError


def openai_error_body(err: PoolgateError) -> dict:
    """The OpenAI (and vLLM) error envelope."""
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}


def cohere_error_body(err: PoolgateError) -> dict:
    """Cohere's documented error body."""
    return {"message": err.message}


def tei_error_type(status: int) -> str:
    """TEI's ``error_type`` for a status: its names for overload, health and backend failures, else Validation
    (TEI has no name for a refused API key: Unauthorized)."""
    named = {401: "Unauthorized", 403: "Unauthorized", 429: "Overloaded", 503: "Unhealthy"}
    return named.get(status, "Backend" if status >= 500 else "Validation")


def tei_error_body(err: PoolgateError) -> dict:
    """text-embeddings-inference's error body."""
    return {"error": err.message, "error_type": tei_error_type(err.status)}


def oip_error_body(err: PoolgateError) -> dict:
    """The Open Inference Protocol's (KServe v2, Triton) error body."""
    return {"error": err.message}


# Error shape name (``Route.errors``) -> body builder.
ERROR_FORMATS: dict[str, Callable[[PoolgateError], dict]] = {
    "openai": openai_error_body,
    "cohere": cohere_error_body,
    "tei": tei_error_body,
    "oip": oip_error_body,
}


class HTTPError(PoolgateError):
    """One of aiohttp's own HTTP exceptions (404 no route, 405 wrong method, 413 body too large) as a PoolgateError."""

    def __init__(self, exc: web.HTTPException):
        phrase = HTTPStatus(exc.status).phrase
        text = exc.text or ""
        super().__init__(phrase if not text or text.startswith(f"{exc.status}:") else text)
        self.status = exc.status
        self.type = phrase.replace(" ", "").replace("-", "") + "Error"
        self.code = phrase.lower().replace(" ", "_").replace("-", "_")
        self.allow = exc.headers.get("Allow")
