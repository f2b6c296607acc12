"""Sends a job's lines to a gateway over HTTP: the same routes, checks and answers as any client gets.

Every line of every job runs as the HTTP request it describes, so a line
gets exactly what the route answers a client (its body checks, its errors,
its token counts) and the gateway's admission, tenant quotas, spans and
metrics see it like any request. Each request says ``X-Poolgate-Lane: bulk``
(it runs below every live request: ``gateway.serving``) and carries
``X-Request-Timeout`` (the line's own deadline, not the server's default for
live calls).

What is retried, and what fails the line:

- 429 and 503 (admission full, a tenant over its quota, a model still
  loading, a draining gateway): waited out, as long as they last, for the
  answer's ``Retry-After`` (1 to 60 s, with jitter); a job runs at the pace
  the live traffic leaves it;
- the gateway unreachable (refused, reset, a restart): retried with backoff,
  up to ``unreachable_s`` without one answer, then ``GatewayGone`` stops the
  job (the lines written so far stay; a re-run goes on from there);
- 401 and 403 (no key, a wrong key, a key without access): ``NotAllowed``
  stops the job, since every other line would get the same;
- 504 (the line's deadline passed in the gateway's queue): tried
  ``DEADLINE_TRIES`` times in all;
- any other answer is the line's: 200 a success, the rest a failed line with
  the route's own error body.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any

import aiohttp

from poolgate.gateway.jobs.lines import Line

LANE_HEADER = "X-Poolgate-Lane"
TIMEOUT_HEADER = "X-Request-Timeout"
DEADLINE_TRIES = 3
MAX_WAIT_S = 60.0


class JobStopped(Exception):
    """The job cannot go on (the lines written so far stay; a re-run goes on from there)."""


class GatewayGone(JobStopped):
    """The gateway did not answer for ``unreachable_s``."""


class NotAllowed(JobStopped):
    """The gateway refused the job's API key (401 or 403): no line could run, so none is failed for it."""


@dataclass(frozen=True)
class Answer:
    """The route's answer to one line: its status, the request id it gave, its JSON body."""

    status: int
    request_id: str
    body: Any


def tokens_of(body: Any) -> int:
    """The input tokens an answer reports (OpenAI/vLLM ``usage``, Cohere ``meta.billed_units``), 0 if none."""
    if not isinstance(body, dict):
        return 0
    usage = body.get("usage")
    if isinstance(usage, dict):
        value = usage.get("prompt_tokens", usage.get("total_tokens"))
        return value if isinstance(value, int) else 0
    units = (body.get("meta") or {}).get("billed_units") if isinstance(body.get("meta"), dict) else None
    if isinstance(units, dict) and isinstance(units.get("input_tokens"), int):
        return units["input_tokens"]
    return 0


class Sender:
    """Lines to one gateway: ``base_url`` (``http://host:port``), or a unix socket path (``unix``)."""

    def __init__(
        self,
        base_url: str = "http://localhost",
        *,
        unix: str | None = None,
        headers: dict[str, str] | None = None,
        line_timeout_s: float = 600.0,
        unreachable_s: float = 600.0,
        lane: str = "bulk",
        connections: int = 64,
    ):
        self.base_url = base_url.rstrip("/")
        self.headers = {**(headers or {}), TIMEOUT_HEADER: f"{line_timeout_s:g}", "Content-Type": "application/json"}
        if lane != "live":
            self.headers[LANE_HEADER] = lane
        self.unreachable_s = unreachable_s
        self._unix, self._connections = unix, connections
        self._session: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(total=line_timeout_s + 30)

    async def __aenter__(self) -> Sender:
        connector: aiohttp.BaseConnector
        if self._unix is not None:
            connector = aiohttp.UnixConnector(path=self._unix, limit=self._connections)
        else:
            connector = aiohttp.TCPConnector(limit=self._connections)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, line: Line, extra_headers: dict[str, str] | None = None) -> Answer:
        """The route's answer to ``line`` (module doc: what is retried); ``GatewayGone`` when unreachable."""
        assert self._session is not None, "use `async with Sender(...)`"
        data = json.dumps(line.body, separators=(",", ":")).encode()
        headers = {**self.headers, **(extra_headers or {})}
        unreachable, backoff, deadline_tries = 0.0, 0.25, 0
        while True:
            try:
                async with self._session.post(self.base_url + line.url, data=data, headers=headers) as resp:
                    raw = await resp.read()
                    status, request_id = resp.status, resp.headers.get("X-Request-Id", "")
                    retry_after = resp.headers.get("Retry-After")
            except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                if unreachable >= self.unreachable_s:
                    raise GatewayGone(f"no answer from {self.base_url} for {unreachable:.0f} s: {exc}") from exc
                wait = min(backoff, 10.0)
                await asyncio.sleep(wait)
                unreachable, backoff = unreachable + wait, backoff * 2
                continue
            unreachable, backoff = 0.0, 0.25
            if status in (429, 503):
                await asyncio.sleep(_retry_after(retry_after))
                continue
            if status in (401, 403):
                raise NotAllowed(f"the gateway at {self.base_url} refused the API key ({status}): {raw[:300]!r}")
            if status == 504 and (deadline_tries := deadline_tries + 1) < DEADLINE_TRIES:
                continue
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = {"error": {"message": raw[:500].decode("utf-8", "replace"), "type": f"http_{status}"}}
            return Answer(status, request_id, body)


def _retry_after(value: str | None) -> float:
    """The answer's Retry-After (seconds, 1 to 60), with up to 25 % jitter so waiting lines do not return at once."""
    try:
        seconds = float(value) if value is not None else 1.0
    except ValueError:
        seconds = 1.0
    return min(MAX_WAIT_S, max(1.0, seconds)) * random.uniform(1.0, 1.25)
