"""Starts and stops the workers of each served model's pools, and adds and removes the models in the router.

The gateway's one owner of workers: at start-up for every ``PoolConfig`` of the
config, and later for a model the admin API loads or unloads. For one pool:

- local workers: one ``Supervisor`` each (``gateway.pools.supervisor``: restarted with
  backoff after they die), already placed by the config (device, CPU cores),
  with the backend's environment (``shared.config.backends.worker_env``); a pool runs
  with those that came up and the rest keep retrying in the background;
- remote workers (``tcp://``, ``unix:``): dialed with the gateway's worker token
  and TLS (``GatewayConfig.worker_security``), waiting for those still loading;
- ``dns+tcp://`` names: resolved now and re-resolved in the background
  (``gateway.pools.discovery``), workers joining and leaving the pool.

A pool must have one worker up at start, else the start fails (stopping what it
started). A worker that serves a model other than its pool's is refused. The
pool's admission (``admission_limits``): the gateway's input cap and queued-work
limit, and its own ``max_in_flight_per_worker``, else the gateway's. A model's
tokenizer comes from its first worker (the ``info`` op's tokenizer files,
``_front``): the gateway tokenizes every call of the model with it, so workers
(and pools) of one model whose tokenizers hash differently fail the start.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from poolgate.gateway.pools.admission import AdmissionLimits
from poolgate.gateway.pools.discovery import DEFAULT_INTERVAL_S, Discovery, Resolver, is_dns_url, resolve_host
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.router import Router
from poolgate.gateway.pools.supervisor import Supervisor, start_all
from poolgate.shared.config.backends import worker_env
from poolgate.shared.config.frozen import GatewayConfig, PoolConfig
from poolgate.shared.domain.errors import Conflict, Unavailable
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.inputs.encoders import encoder_for
from poolgate.shared.inputs.front import Front
from poolgate.shared.wire.messages import ModelInfo
from poolgate.shared.wire.transport import WorkerClient
from poolgate.shared.wire.transport_security import client_context

log = logging.getLogger("poolgate.gateway.pools.fleet")


def admission_limits(config: GatewayConfig, pc: PoolConfig) -> AdmissionLimits:
    """The pool's admission limits from the gateway's config and the pool's own table; with N gateway processes,
    each process's share of the shared ones (``gateway.pools.admission``)."""
    n = config.gateway_processes
    calls = pc.max_in_flight_per_worker or config.max_in_flight_per_worker
    return AdmissionLimits(
        max_inputs_per_request=config.max_inputs_per_request,
        max_chars_per_input=config.max_chars_per_input,
        max_calls_per_worker=None if calls is None else max(1, calls // n),
        max_queued_tokens=None if config.max_queued_tokens is None else max(1, config.max_queued_tokens // n),
        max_queued_s=None if config.max_queued_s is None else config.max_queued_s / n,
    )


@dataclass
class RunningPool:
    """What keeps one pool's workers: its supervisors and its DNS watchers (background tasks)."""

    config: PoolConfig
    supervisors: list[Supervisor] = field(default_factory=list)
    discoveries: list[Discovery] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(s.stop() for s in self.supervisors), return_exceptions=True)


# a started pool: what keeps its workers, and the pool the router serves
Started = tuple[RunningPool, WorkerPool]


class Fleet:
    """Every served model's running pools (module doc); ``runner_factory`` is for tests (fake models)."""

    def __init__(
        self,
        config: GatewayConfig,
        router: Router,
        folder: Path,
        *,
        runner_factory: str | None = None,
        resolver: Resolver = resolve_host,
        discovery_interval_s: float = DEFAULT_INTERVAL_S,
    ):
        self.config, self.router, self.folder = config, router, folder
        self.runner_factory, self.resolver, self.discovery_interval_s = runner_factory, resolver, discovery_interval_s
        self.running: dict[str, list[RunningPool]] = {}  # model name -> its pools' keepers
        self._sockets = itertools.count()
        self._lock = asyncio.Lock()  # serializes changes to the router and ``running``
        self._starting: set[str] = set()  # models being started (not served yet)
        self._fronts: dict[str, Front] = {}  # model name -> its Front (one for all its pools; gone with the model)

    async def start(self, pools: Sequence[PoolConfig]) -> list[str]:
        """Bring ``pools`` up and serve them (all or none); the names of the models they serve.
        Conflict (409) for a model that is served or being started already."""
        names = {p.model for p in pools if p.model is not None}
        busy = sorted(names & (set(self.router.pools) | self._starting))
        if busy:
            raise Conflict(f"model '{busy[0]}' is already served; unload it first")
        self._starting |= names
        try:
            results = await asyncio.gather(*(self._start_pool(p) for p in pools), return_exceptions=True)
            async with self._lock:
                return await self._serve(results)
        finally:
            self._starting -= names

    async def _serve(self, results: list[list[Started] | BaseException]) -> list[str]:
        """Add the started pools to the router, or stop them all if any failed."""
        failed = [r for r in results if isinstance(r, BaseException)]
        started = [pair for r in results if not isinstance(r, BaseException) for pair in r]
        served = sorted({pool.name for _, pool in started} & set(self.router.pools))
        if served:
            failed.append(Conflict(f"model '{served[0]}' is already served; unload it first"))
        if not failed:
            try:
                for _, pool in started:
                    self.router.add(pool)
            except ValueError as exc:
                failed.append(exc)
        if failed:
            for _, pool in started:
                self._forget(pool)
            await asyncio.gather(*(run.stop() for run, _ in started), *(pool.close() for _, pool in started))
            raise failed[0]
        for run, pool in started:
            self.running.setdefault(pool.name, []).append(run)
            self._watch(run, pool)
        return list(dict.fromkeys(pool.name for _, pool in started))

    def _forget(self, pool: WorkerPool) -> None:
        model = self.router.pools.get(pool.name)
        if model is not None and pool in model.pools:
            self.router.remove(pool.name)

    async def unload(self, name: str, drain_timeout_s: float) -> None:
        """Stop serving model ``name``: no new calls (404), the calls in flight finish (up to
        ``drain_timeout_s``), then its workers stop. ModelNotFound if it is not served."""
        async with self._lock:
            model = self.router.remove(name)
            runs = self.running.pop(name, [])
            self._fronts.pop(name, None)
        log.info("unloading %s: draining", name)
        model.drain()
        try:
            await asyncio.wait_for(model.idle(), drain_timeout_s)
        except TimeoutError:
            log.warning("unloading %s: calls still in flight after %gs; stopping anyway", name, drain_timeout_s)
        await asyncio.gather(*(run.stop() for run in runs))
        await model.close()
        log.info("unloaded %s", name)

    async def stop(self) -> None:
        """Stop every supervisor and watcher (the router closes the clients)."""
        runs = [run for model in self.running.values() for run in model]
        self.running.clear()
        await asyncio.gather(*(run.stop() for run in runs))

    async def _start_pool(self, pc: PoolConfig) -> list[Started]:
        run = RunningPool(pc)
        try:
            clients = await self._start_locals(pc, run) + await self._dial_remotes(pc, run)
            return await self._make_pools(pc, run, clients)
        except BaseException:
            await run.stop()
            raise

    async def _start_locals(self, pc: PoolConfig, run: RunningPool) -> list[WorkerClient]:
        for i, cfg in enumerate(pc.workers):
            run.supervisors.append(
                Supervisor(
                    cfg,
                    self._address(),
                    i,
                    ready_timeout=self.config.startup_timeout_s,
                    env=worker_env,
                    runner_factory=self.runner_factory,
                )
            )
        errors = await start_all(run.supervisors)  # those that failed keep retrying in the background (``_watch``)
        up = [s.worker.client for s in run.supervisors if s.worker is not None and s.worker.client is not None]
        if errors and not up and not pc.remotes:
            if len(errors) == 1:
                raise errors[0]
            raise Unavailable(f"no worker of {pc.model} came up ({len(errors)} tried): {errors[0]}") from errors[0]
        if run.supervisors and len(up) < len(run.supervisors):
            log.warning(
                "serving %s (%s) with %d of %d local workers; the others keep retrying in the background",
                pc.model,
                pc.backend,
                len(up),
                len(run.supervisors),
            )
        return up

    def _address(self) -> str:
        """Where the next local worker listens: a socket in the gateway's private folder, or a TCP port the
        worker binds itself and reports (``gateway.pools.local_worker``: no race for the port)."""
        if self.config.transport == "unix":
            return f"unix:{self.folder / f'worker-{next(self._sockets)}.sock'}"
        return "tcp://127.0.0.1:0"

    async def _dial_remotes(self, pc: PoolConfig, run: RunningPool) -> list[WorkerClient]:
        static = [url for url in pc.remotes if not is_dns_url(url)]
        dialed = await asyncio.gather(*(self._dial_until_up(url) for url in static), return_exceptions=True)
        clients = [c for c in dialed if not isinstance(c, BaseException)]
        failed = [c for c in dialed if isinstance(c, BaseException)]
        if failed:
            await asyncio.gather(*(c.close() for c in clients))
            raise failed[0]
        for url in pc.remotes:
            if is_dns_url(url):  # wait for DNS only when nothing else serves the pool
                run.discoveries.append(
                    discovery := Discovery(
                        url, self.connect, resolver=self.resolver, interval_s=self.discovery_interval_s
                    )
                )
                clients += await discovery.first(0 if clients or pc.workers else self.config.startup_timeout_s)
        return clients

    async def connect(self, url: str) -> WorkerClient:
        """Dial one worker with the gateway's token, and TLS for TCP (a Unix socket is protected by its
        permissions); Unavailable when it does not answer."""
        sec = self.config.worker_security
        tls = client_context(sec) if url.startswith("tcp://") else None
        return await WorkerClient.connect(url, token=sec.token, tls=tls, server_name=sec.tls_server_name)

    async def _dial_until_up(self, url: str) -> WorkerClient:
        """Dial a remote worker until it answers (it may still be loading), up to the start-up timeout."""
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + self.config.startup_timeout_s, 0.1
        while True:
            try:
                return await self.connect(url)
            except Unavailable:
                if loop.time() + delay > deadline:
                    raise
                log.info("waiting for worker %s", url)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _make_pools(self, pc: PoolConfig, run: RunningPool, clients: list[WorkerClient]) -> list[Started]:
        """One pool of ``clients`` (several when the config left the model to the workers: ``--worker-url``),
        each with its model's tokenizer (``_front``)."""
        by_name: dict[str, list[tuple[WorkerClient, ModelInfo]]] = {}
        for client, info in zip(clients, await asyncio.gather(*(c.info() for c in clients)), strict=True):
            if pc.model is not None and info.served_model_name != pc.model:
                await asyncio.gather(*(c.close() for c in clients))
                raise Unavailable(f"worker {client.address} serves '{info.served_model_name}', not '{pc.model}'")
            by_name.setdefault(info.served_model_name, []).append((client, info))
        if not by_name:
            raise Unavailable(f"no worker of {pc.model or 'the remote workers'} came up (see the log above)")
        limits = admission_limits(self.config, pc)
        started: list[Started] = []
        try:
            for members in by_name.values():
                front = await self._front(members, pc.media)
                keeper = run if not started else RunningPool(pc)
                pool = WorkerPool(members[0][1], [c for c, _ in members], limits=limits, front=front)
                started.append((keeper, pool))
        except Unavailable:
            await asyncio.gather(*(c.close() for c in clients))
            raise
        return started

    async def _front(self, members: list[tuple[WorkerClient, ModelInfo]], media: MediaLimits) -> Front:
        """The model's tokenizer, from its first worker's files (``shared.inputs.tokenizer_files``); every
        worker of it must have the same ones, and so must its pools on other backends (one per hash). ``media``:
        the limits on its images and audio (its first pool's, as its tokenizer)."""
        (first, info), *others = members
        for client, other in others:
            if other.tokenizer_sha256 != info.tokenizer_sha256:
                raise Unavailable(
                    f"workers {first.address} and {client.address} of model '{info.served_model_name}' have "
                    f"different tokenizers (sha256 {info.tokenizer_sha256} and {other.tokenizer_sha256}): one "
                    "model name must tokenize one way"
                )
        cached = self._fronts.get(info.served_model_name)
        if cached is not None and cached.info.tokenizer_sha256 == info.tokenizer_sha256:
            return cached
        _, files = await first.tokenizer()
        if info.tokenizer_sha256 is not None and files.sha256 != info.tokenizer_sha256:
            raise Unavailable(f"worker {first.address} sent tokenizer files that do not match its sha256")
        front = self._fronts[info.served_model_name] = Front(info, await asyncio.to_thread(encoder_for, files), media)
        return front

    def _watch(self, run: RunningPool, pool: WorkerPool) -> None:
        """Start the pool's background work: restarting local workers, re-resolving DNS names."""
        for sup in run.supervisors:
            sup.attach(pool)
            run.tasks.append(asyncio.create_task(sup.run(), name=f"supervise {sup.name}/{sup.index}"))
        for discovery in run.discoveries:
            run.tasks.append(asyncio.create_task(discovery.run(pool), name=f"discover {discovery.url}"))
