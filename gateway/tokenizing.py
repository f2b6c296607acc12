"""The gateway's tokenizer pool: threads sized to the host, where each call is shaped and tokenized off the loop.

A model's ``Front`` (``shared.inputs.front``) does the work; the Rust
tokenizer releases the GIL while it encodes a batch, so a few threads keep
the event loop free to parse, route and encode other requests while calls
are tokenized. One pool per gateway process (``make_app`` creates it, its
cleanup shuts it down), of the most ``--tokenizer-threads`` a configured
model asks for, else one thread per CPU (2 to ``MAX_THREADS``);
``--gateway-processes`` multiplies it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from aiohttp import web

from poolgate.gateway.http.state import CONFIG
from poolgate.shared.config.frozen import GatewayConfig

T = TypeVar("T")
A = TypeVar("A")

MAX_THREADS = 8
TOKENIZER = web.AppKey("tokenizer", ThreadPoolExecutor)


def pool_threads(cpus: int | None = None) -> int:
    """Threads for a host of ``cpus`` logical CPUs (default: this one's): one each, 2 to ``MAX_THREADS``."""
    return max(2, min(MAX_THREADS, cpus or os.cpu_count() or 1))


def configured_threads(config: GatewayConfig) -> int:
    """The most ``tokenizer_threads`` a configured model asks for, else ``pool_threads()``."""
    asked = [w.tokenizer_threads for pool in config.pools for w in pool.workers if w.tokenizer_threads]
    return max(asked) if asked else pool_threads()


async def tokenizer_pool(app: web.Application) -> AsyncIterator[None]:
    """The app's cleanup context: the pool for its lifetime."""
    threads = configured_threads(app[CONFIG])
    app[TOKENIZER] = ThreadPoolExecutor(threads, thread_name_prefix="poolgate-tokenize")
    yield
    app[TOKENIZER].shutdown(wait=False, cancel_futures=True)


async def run_tokenizer(app: web.Application, fn: Callable[[A], T], arg: A) -> T:
    """``fn(arg)`` in the app's tokenizer pool."""
    return await asyncio.get_running_loop().run_in_executor(app[TOKENIZER], fn, arg)
