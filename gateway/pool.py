"""A pool of workers serving one model: least-loaded pick, health flags, admission."""
from __future__ import annotations

import asyncio
import time
from typing import Protocol

from poolgate.shared.errors import DeadlineExceeded, Overloaded, Unavailable
from poolgate.shared.wire import ModelInfo, PoolingCall, PoolingResult


class Client(Protocol):
    """The part of ``shared.transport.WorkerClient`` a pool uses."""

    address: str

    async def pool(self, call: PoolingCall) -> PoolingResult: ...

    async def health(self) -> dict: ...

    async def close(self) -> None: ...


class WorkerPool:
    """Sends each call to the ready client with the fewest calls in flight.

    Load is counted here, per client, when a call is picked (not when the
    client gets round to counting it), so concurrent picks see each other.
    ``max_in_flight`` caps calls per worker; when every ready worker is at the
    cap the call is refused with ``Overloaded`` (429). A client that raises
    ``Unavailable`` (connection lost) is marked not ready until ``mark_ready``
    or a successful ``probe``.
    """

    def __init__(self, model_info: ModelInfo, clients: list[Client], *,
                 max_in_flight: int | None = None, ready: bool = True):
        if not clients:
            raise ValueError("a WorkerPool needs at least one client")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.info = model_info
        self.clients = list(clients)
        self.max_in_flight = max_in_flight
        self._ready = {id(c): ready for c in self.clients}
        self._load = {id(c): 0 for c in self.clients}
        self._recoveries = {id(c): 0 for c in self.clients}

    @property
    def name(self) -> str:
        return self.info.served_model_name

    @property
    def ready(self) -> bool:
        return any(self._ready.values())

    def is_ready(self, client: Client) -> bool:
        return self._ready[id(client)]

    def mark_ready(self, client: Client, ready: bool = True) -> None:
        if ready and not self._ready[id(client)]:
            self._recoveries[id(client)] += 1
        self._ready[id(client)] = ready

    def recoveries(self, client: Client) -> int:
        """How often ``client`` came back after being marked down (or not ready at start)."""
        return self._recoveries[id(client)]

    def in_flight(self, client: Client) -> int:
        return self._load[id(client)]

    async def submit(self, call: PoolingCall) -> PoolingResult:
        """The call's result from the least-loaded ready worker, or a 504 once its deadline passes
        (the transport then cancels it in the worker)."""
        client = self._pick()
        self._load[id(client)] += 1
        try:
            if call.deadline is None:
                return await client.pool(call)
            return await asyncio.wait_for(client.pool(call), max(call.deadline - time.time(), 0.0))
        except asyncio.TimeoutError:
            raise DeadlineExceeded(f"Request {call.request_id} did not finish before its deadline.") from None
        except Unavailable:
            self.mark_ready(client, False)
            raise
        finally:
            self._load[id(client)] -= 1

    def _pick(self) -> Client:
        ready = [c for c in self.clients if self._ready[id(c)]]
        if not ready:
            raise Unavailable(f"No worker is ready to serve model '{self.name}'.")
        client = min(ready, key=lambda c: self._load[id(c)])
        if self.max_in_flight is not None and self._load[id(client)] >= self.max_in_flight:
            raise Overloaded(f"Every worker serving model '{self.name}' is busy; retry shortly.")
        return client

    async def probe(self) -> None:
        """Ask every client for its health and set its ready flag from the answer."""
        for client in self.clients:
            try:
                await client.health()
            except Unavailable:
                self.mark_ready(client, False)
            else:
                self.mark_ready(client, True)

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
