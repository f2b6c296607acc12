"""The HTTP load loop: C concurrent ``POST /v1/embeddings`` requests over a corpus.

Request bodies are serialized before the clock starts. Every response is
decoded (base64 -> little-endian float32, or float lists) and checked: one
embedding per input, indices 0..n-1, one dimension across the whole run.
A non-200 status, a malformed body, a timeout or a connection failure counts
as an error; latencies are kept for successful requests only.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import numpy as np

MAX_ERROR_SAMPLES = 5


@dataclass(frozen=True)
class LoadConfig:
    """What to send, where, and how hard; parsed once by the CLI."""

    url: str
    model: str
    api_key: str | None = None
    batch_size: int = 32
    concurrency: int = 8
    encoding_format: Literal["base64", "float"] = "base64"
    warmup: int = 4
    passes: int = 1
    duration_s: float | None = None
    timeout_s: float = 120.0
    truncate: bool = True  # send truncate_prompt_tokens=-1, as sentence-transformers truncates
    keep_vectors: bool = False  # keep each request's vectors (by request body) for --check-cosine


@dataclass
class LoadResult:
    """Raw counts and timings of one timed run (warm-up excluded)."""

    wall_s: float = 0.0
    requests: int = 0
    ok_requests: int = 0
    inputs: int = 0
    prompt_tokens: int = 0
    latencies_s: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    embedding_dim: int | None = None
    warmup_errors: int = 0
    vectors: dict[bytes, np.ndarray] = field(default_factory=dict)  # request body -> its (n, dim) vectors

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def add_error(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.error_samples) < MAX_ERROR_SAMPLES:
            self.error_samples.append(f"{kind}: {detail[:300]}")


class BadResponse(Exception):
    """A 200 response whose body is not the embeddings we asked for."""


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def first_model_id(url: str, api_key: str | None = None, timeout_s: float = 30.0) -> str:
    """The first id listed by ``GET {url}/v1/models``."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with (
        aiohttp.ClientSession(timeout=timeout, headers=auth_headers(api_key)) as session,
        session.get(f"{url.rstrip('/')}/v1/models") as resp,
    ):
        if resp.status != 200:
            raise BadResponse(f"GET /v1/models -> HTTP {resp.status}: {(await resp.text())[:300]}")
        data = (await resp.json(content_type=None)).get("data") or []
    if not data or "id" not in data[0]:
        raise BadResponse("GET /v1/models listed no model")
    return str(data[0]["id"])


def make_payloads(texts: list[str], cfg: LoadConfig) -> list[tuple[bytes, int]]:
    """One serialized request body per batch of ``cfg.batch_size`` texts, with its size."""
    out = []
    for start in range(0, len(texts), cfg.batch_size):
        batch = texts[start : start + cfg.batch_size]
        body: dict[str, Any] = {"model": cfg.model, "input": batch, "encoding_format": cfg.encoding_format}
        if cfg.truncate:
            body["truncate_prompt_tokens"] = -1
        out.append((json.dumps(body).encode(), len(batch)))
    return out


def decode_embeddings(body: dict, n_inputs: int, encoding_format: str) -> tuple[np.ndarray, int]:
    """The (n_inputs, dim) float32 matrix and ``usage.prompt_tokens``; raises BadResponse."""
    try:
        data = sorted(body["data"], key=lambda d: d["index"])
        tokens = int(body["usage"]["prompt_tokens"])
        if [d["index"] for d in data] != list(range(n_inputs)):
            raise BadResponse(f"expected indices 0..{n_inputs - 1}, got {len(data)} items")
        if encoding_format == "base64":
            rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]
        else:
            rows = [np.asarray(d["embedding"], dtype=np.float32) for d in data]
    except (KeyError, TypeError, ValueError) as exc:
        raise BadResponse(f"malformed body: {exc!r}") from exc
    dims = {r.shape for r in rows}  # a token task's rows: (tokens, dim), one input's tokens each
    if len(dims) != 1 or 0 in rows[0].shape:
        raise BadResponse(f"embedding shapes {sorted(dims)} in one response")
    return np.stack(rows), tokens  # (n_inputs, dim), or (n_inputs, tokens, dim)


async def send_one(
    session: aiohttp.ClientSession, url: str, payload: tuple[bytes, int], cfg: LoadConfig, result: LoadResult
) -> None:
    """POST one batch; record its latency, inputs and tokens, or the error."""
    body, n_inputs = payload
    result.requests += 1
    start = time.perf_counter()
    try:
        async with session.post(url, data=body) as resp:
            raw = await resp.read()
            latency = time.perf_counter() - start
            if resp.status != 200:
                result.add_error(f"HTTP {resp.status}", raw.decode("utf-8", "replace"))
                return
        vectors, tokens = decode_embeddings(json.loads(raw), n_inputs, cfg.encoding_format)
        dim = vectors.shape[-1]  # a token task's answer is (inputs, tokens, dim): the vectors' own width
        if result.embedding_dim is None:
            result.embedding_dim = dim
        elif dim != result.embedding_dim:
            raise BadResponse(f"dimension {dim} != {result.embedding_dim} seen before")
        if cfg.keep_vectors:
            result.vectors.setdefault(body, vectors)
    except BadResponse as exc:
        result.add_error("bad response", str(exc))
    except json.JSONDecodeError as exc:
        result.add_error("bad response", f"not JSON: {exc}")
    except TimeoutError:
        result.add_error("timeout", f"no response within {cfg.timeout_s}s")
    except aiohttp.ClientError as exc:
        result.add_error(type(exc).__name__, str(exc))
    else:
        result.ok_requests += 1
        result.inputs += n_inputs
        result.prompt_tokens += tokens
        result.latencies_s.append(latency)


def request_stream(payloads: list[tuple[bytes, int]], cfg: LoadConfig) -> Iterator[tuple[bytes, int]]:
    """Whole passes over the corpus, or cycles of it until the duration is up."""
    if cfg.duration_s is None:
        for _ in range(cfg.passes):
            yield from payloads
        return
    deadline = time.perf_counter() + cfg.duration_s
    while True:
        for payload in payloads:
            if time.perf_counter() >= deadline:
                return
            yield payload


async def drive(
    session: aiohttp.ClientSession, url: str, stream: Iterator, concurrency: int, cfg: LoadConfig, result: LoadResult
) -> None:
    """Keep ``concurrency`` requests in flight until the stream is exhausted."""

    async def worker() -> None:
        for payload in stream:
            await send_one(session, url, payload, cfg, result)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def run_load(cfg: LoadConfig, texts: list[str], payloads: list[tuple[bytes, int]] | None = None) -> LoadResult:
    """Warm up, then time the whole run from the first send to the last response; ``payloads`` (bodies made
    elsewhere, each with its input count: ``bench.images``) instead of the texts' when given."""
    payloads = make_payloads(texts, cfg) if payloads is None else payloads
    url = f"{cfg.url.rstrip('/')}/v1/embeddings"
    headers = {"Content-Type": "application/json", **auth_headers(cfg.api_key)}
    connector = aiohttp.TCPConnector(limit=cfg.concurrency)
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        warm = LoadResult()
        if cfg.warmup > 0:
            warm_stream = (payloads[i % len(payloads)] for i in range(cfg.warmup))
            await drive(session, url, warm_stream, min(cfg.concurrency, cfg.warmup), cfg, warm)
        result = LoadResult(warmup_errors=warm.error_count)
        start = time.perf_counter()
        await drive(session, url, request_stream(payloads, cfg), cfg.concurrency, cfg, result)
        result.wall_s = time.perf_counter() - start
    return result
