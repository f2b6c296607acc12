"""TEI's per-request timing headers, on every answer the serving path gave (any dialect's route).

text-embeddings-inference answers each request with its measured work in
headers (integers; times in whole milliseconds, truncated), and clients and
proxies that moved from TEI read them. poolgate sets the same, from the
request's telemetry record (``gateway.telemetry.record``), so they are
measured, not estimated:

- ``x-compute-type``: the backend that ran it (``cpu``, ``cuda``, ...; TEI's is
  a constant ``gpu+optimized``);
- ``x-compute-time`` and ``x-total-time``: from arrival until the response is
  ready to be written (TEI gives both the same value);
- ``x-compute-characters``: the characters of the inputs (the texts, every text
  field of an object input, a chat's contents); ``x-compute-tokens``: the
  tokens the model's tokenizer counted (``usage.prompt_tokens``);
- ``x-tokenization-time``: the inputs' wait for and run in the gateway's
  tokenizer pool; ``x-queue-time`` and ``x-inference-time``: the worker's
  (queued until its first batch, then in batches).

Only a request the serving path answered gets them (an error, or a route that
runs no model such as ``/tokenize``, gets none).
"""

from __future__ import annotations

import time

from poolgate.gateway.telemetry.record import RequestRecord


def _ms(seconds: float | None) -> str:
    return str(int(max(seconds or 0.0, 0.0) * 1000))


def timing_headers(record: RequestRecord, now: float | None = None) -> dict[str, str]:
    """The headers of a served request (module doc); empty when the serving path did not answer it."""
    if record.prompt_tokens is None:
        return {}
    total = _ms((time.perf_counter() if now is None else now) - record.started)
    tokenize = record.tokenize_ns
    return {
        "x-compute-type": record.backend or "unknown",
        "x-compute-time": total,
        "x-compute-characters": str(record.characters or 0),
        "x-compute-tokens": str(record.prompt_tokens),
        "x-total-time": total,
        "x-tokenization-time": _ms((tokenize[1] - tokenize[0]) / 1e9 if tokenize is not None else None),
        "x-queue-time": _ms(record.queue_s),
        "x-inference-time": _ms(record.inference_s),
    }
