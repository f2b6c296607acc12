"""One served model's pools (one per backend) and the choice between them: the first that can take the call.

A model is served by one or more ``WorkerPool``s, e.g. CUDA replicas and a CPU
overflow pool, kept in the order they were configured (``[[models]]`` tables in
file order). A job (a tokenized pooling call, ``gateway.pools.job``)
goes to the FIRST pool that admits it (its ``Admission``: a ready worker below
the per-worker cap, room in its queued tokens); when that pool refuses it
(``Overloaded``: the pool is full, or its workers' queues are) or cannot serve
it (``Unavailable``: no ready worker, or its worker was lost and the pool's own
retry failed too), it goes to the next pool, within the job's deadline. Only
when every pool refused does the client see the last refusal (429 or 503).
Pooling is idempotent, so a call that is tried again elsewhere is harmless.

So the first pool takes all the traffic it can, and the later ones take the
overflow and stand in while it is down. Without caps the first ready pool takes
everything (its least-loaded worker, ``gateway.pools.pool``).

For the code that looks at workers (metrics, health checks, the admin API),
``ModelPools`` also answers the per-client questions a ``WorkerPool`` answers
(``clients``, ``is_ready``, ``recoveries``, ``in_flight``, ``probe``...) over all
its pools.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from poolgate.gateway.pools.job import Job, pooling_job
from poolgate.gateway.pools.pool import Client, WorkerPool
from poolgate.shared.domain.errors import Overloaded, Unavailable
from poolgate.shared.inputs.front import Front
from poolgate.shared.wire.messages import ModelInfo, PoolingResult
from poolgate.shared.wire.token_call import TokenCall

# ModelInfo fields every pool of one model must agree on (what clients see must not depend on the pool)
SAME_FIELDS = (
    "tasks",
    "embedding_dim",
    "max_model_len",
    "labels",
    "is_matryoshka",
    "matryoshka_dimensions",
    "chunked_processing",
    "max_embed_len",
    "tokenizer_sha256",  # they tokenize alike (shared.inputs.tokenizer_files)
    "max_tokens_per_request",
)


class ModelPools:
    """A served model: its pools in preference order (see the module doc)."""

    def __init__(self, pools: list[WorkerPool]):
        if not pools:
            raise ValueError("a model needs at least one pool")
        self.pools: list[WorkerPool] = []
        for pool in pools:
            self.add_pool(pool)

    @property
    def info(self) -> ModelInfo:
        """The model as its first pool's workers describe it (every pool agrees but on backend and dtype)."""
        return self.pools[0].info

    @property
    def name(self) -> str:
        return self.pools[0].name

    @property
    def backends(self) -> list[str]:
        return [pool.info.backend for pool in self.pools]

    def add_pool(self, pool: WorkerPool) -> None:
        """Add ``pool`` after the others (the overflow of those before it); ValueError if it does not fit."""
        if self.pools:
            first = self.pools[0].info
            if pool.name != first.served_model_name:
                raise ValueError(f"pool of '{pool.name}' added to model '{first.served_model_name}'")
            if pool.info.backend in self.backends:
                raise ValueError(f"model '{pool.name}' already has a pool on backend '{pool.info.backend}'")
            differ = [f for f in SAME_FIELDS if getattr(pool.info, f) != getattr(first, f)]
            if differ:
                raise ValueError(
                    f"the {pool.info.backend} pool of '{pool.name}' differs from its "
                    f"{first.backend} pool in {', '.join(differ)}: they must serve the same model"
                )
        self.pools.append(pool)

    @property
    def front(self) -> Front:
        """The model's tokenizer and input shaping (``shared.inputs.front``); 503 until it is known."""
        front = self.pools[0].front
        if front is None:
            raise Unavailable(f"model '{self.name}' has no tokenizer loaded yet; retry shortly.")
        return front

    def check(self, inputs: int, longest_chars: int) -> None:
        """The request's own limits (400, before it is tokenized): its input count, its longest input."""
        self.pools[0].admission.check(inputs, longest_chars)

    async def submit(self, call: TokenCall) -> PoolingResult:
        """The call's result (``run`` of its pooling job)."""
        return await self.run(pooling_job(call))

    async def run(self, job: Job) -> Any:
        """The job's answer from the first pool that takes it (module doc). When none does, the client
        sees 429 if some pool was only full (worth retrying shortly), else the last pool's 503. A job
        over a request limit (400) was refused before it was tokenized (``check``)."""
        refusals: list[Exception] = []
        for pool in self.pools:
            if refusals and job.deadline is not None and job.deadline <= time.time():
                break
            try:
                return await pool.run(job)
            except (Overloaded, Unavailable) as exc:
                refusals.append(exc)
        busy = [r for r in refusals if isinstance(r, Overloaded)]
        raise (busy or refusals)[0 if busy else -1]

    @property
    def ready(self) -> bool:
        return any(pool.ready for pool in self.pools)

    # -- the per-client view of every pool (metrics, health checks, admin) --

    @property
    def clients(self) -> list[Client]:
        return [c for pool in self.pools for c in pool.clients]

    def pool_of(self, client: Client) -> WorkerPool:
        for pool in self.pools:
            if any(c is client for c in pool.clients):
                return pool
        raise KeyError(f"worker {client.address} is in no pool of '{self.name}'")

    def is_ready(self, client: Client) -> bool:
        return self.pool_of(client).is_ready(client)

    def mark_ready(self, client: Client, ready: bool = True) -> None:
        self.pool_of(client).mark_ready(client, ready)

    def recoveries(self, client: Client) -> int:
        return self.pool_of(client).recoveries(client)

    def in_flight(self, client: Client) -> int:
        return self.pool_of(client).in_flight(client)

    async def probe(self, timeout_s: float | None = None) -> None:
        await asyncio.gather(*(pool.probe(timeout_s) for pool in self.pools))

    def snapshot(self) -> list[dict]:
        """Each pool's backend, cap and workers (``WorkerPool.snapshot``), in preference order."""
        return [
            {
                "backend": pool.info.backend,
                "dtype": pool.info.dtype,
                "max_in_flight_per_worker": pool.max_in_flight,
                "ready": pool.ready,
                "workers": pool.snapshot(),
            }
            for pool in self.pools
        ]

    def drain(self) -> None:
        for pool in self.pools:
            pool.drain()

    async def idle(self) -> None:
        await asyncio.gather(*(pool.idle() for pool in self.pools))

    async def close(self) -> None:
        for pool in self.pools:
            await pool.close()
