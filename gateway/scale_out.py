"""``--gateway-processes N``: the parent's N-1 sibling gateway processes on its port, in front of its workers.

The first process (the parent, ``poolgate serve``) spawns and supervises the
local workers as one process does. Once they are up (``gateway.launch``) it
starts N-1 siblings, each ``python -m poolgate.gateway.sibling`` given its
``SiblingStart`` pickled on stdin (never argv, which every user can read): a
config whose pools have no local workers but the parent's workers' Unix
sockets as remote workers, beside the config's own remote ones
(``sibling_config``), with the one worker token the parent gave its local
workers (``parent_config``: a restarted worker keeps its socket and token,
so the siblings find it again). Every process binds the port with
SO_REUSEPORT and the kernel gives each new connection to one of them.

- ``Share``: the processes' private folder (owner-only; the parent makes it
  and removes it when it exits): ``metrics/``, prometheus-client's
  multiprocess files (``gateway.telemetry.metrics``), and ``quotas``, the
  tenants' buckets and counts (``gateway.http.quota_cells``).
- A sibling dies with the parent (``shared.parent_death``); one that exits
  while the parent runs is started again after a backoff
  (``gateway.pools.supervisor.Backoff``), its live gauges dropped.
- SIGTERM/SIGINT to the parent is passed on to every sibling (each drains as
  the parent does, ``gateway.pools.drain``); the parent waits for them, up to
  its drain timeout and a grace, before it stops the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

from poolgate.gateway.http.quota_cells import SharedCells
from poolgate.gateway.http.tenants import CELLS_PER_TENANT
from poolgate.gateway.pools.fleet import Fleet
from poolgate.gateway.pools.supervisor import Backoff
from poolgate.shared.config.frozen import GatewayConfig

log = logging.getLogger("poolgate.gateway.scale_out")

STOP_GRACE_S = 10.0  # past the drain timeout, before a sibling that has not exited is killed
RESTART_BACKOFF = Backoff()  # a local worker's: 0.5 s doubling to 30 s, reset after 60 s up


@dataclass(frozen=True)
class Share:
    """The folder the gateway processes share (module doc); ``parent``: this process made it."""

    folder: Path
    parent: bool

    @property
    def metrics_dir(self) -> Path:
        return self.folder / "metrics"

    def quota_cells(self, config: GatewayConfig) -> SharedCells:
        """The tenants' cells: made (zeroed) by the parent, before any sibling starts; opened by a sibling."""
        return SharedCells(self.folder / "quotas", CELLS_PER_TENANT * len(config.tenants), create=self.parent)


@contextlib.contextmanager
def shared_folder() -> Iterator[Share]:
    """The parent's ``Share``: a fresh owner-only folder, removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="poolgate-processes-"))
    (folder / "metrics").mkdir()
    try:
        yield Share(folder, parent=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class SiblingStart:
    """What a sibling is started with (``gateway.sibling`` reads it from stdin)."""

    config: GatewayConfig
    folder: Path
    parent_pid: int
    index: int  # 1 .. N-1 (the parent is 0)
    log_level: int


def parent_config(config: GatewayConfig) -> GatewayConfig:
    """The parent's ``config``: the port shared (SO_REUSEPORT), and one worker token on its local workers (the
    gateway's worker token, else a fresh one) presented to every worker, so the siblings may dial them."""
    token = config.worker_security.token or secrets.token_urlsafe(32)
    pools = tuple(
        replace(pc, workers=tuple(replace(w, security=replace(w.security, token=token)) for w in pc.workers))
        for pc in config.pools
    )
    return replace(config, pools=pools, reuse_port=True, worker_security=replace(config.worker_security, token=token))


def sibling_config(config: GatewayConfig, fleet: Fleet) -> GatewayConfig:
    """The siblings' config: each pool's local workers replaced by the sockets the parent's ``fleet`` runs them
    on, as remote workers before the pool's own."""
    runs = [run for model in fleet.running.values() for run in model]

    def sockets(pc: object) -> tuple[str, ...]:
        return tuple(s.address for run in runs if run.config is pc for s in run.supervisors)

    pools = tuple(replace(pc, workers=(), devices=(), remotes=(*sockets(pc), *pc.remotes)) for pc in config.pools)
    return replace(config, pools=pools)


class Siblings:
    """The parent's sibling gateway processes (module doc)."""

    def __init__(self, share: Share, count: int, drain_timeout_s: float, backoff: Backoff = RESTART_BACKOFF) -> None:
        self.share, self.count, self.drain_timeout_s, self.backoff = share, count, drain_timeout_s, backoff
        self.processes: dict[int, asyncio.subprocess.Process] = {}  # index -> its running process
        self.tasks: list[asyncio.Task[None]] = []
        self.stopping = False

    def start(self, config: GatewayConfig) -> None:
        """Start siblings 1 .. N-1 with ``config`` and keep them running (from the event loop's thread)."""
        for index in range(1, self.count):
            self.tasks.append(asyncio.create_task(self._keep(index, config), name=f"gateway process {index}"))

    async def _keep(self, index: int, config: GatewayConfig) -> None:
        failures = 0
        while not self.stopping:
            started = time.monotonic()
            process = await self._spawn(index, config)
            code = await process.wait()
            mark_process_dead(process.pid, str(self.share.metrics_dir))
            if self.stopping:  # ``signal`` ran meanwhile (mypy keeps the loop test's narrowing across the await)
                return  # type: ignore[unreachable]
            failures = 1 if time.monotonic() - started >= self.backoff.reset_after_s else failures + 1
            delay = self.backoff.delay(failures)
            log.warning(
                "gateway process %d (pid %d) exited with code %s; again in %gs", index, process.pid, code, delay
            )
            await asyncio.sleep(delay)

    async def _spawn(self, index: int, config: GatewayConfig) -> asyncio.subprocess.Process:
        start = SiblingStart(config, self.share.folder, os.getpid(), index, logging.getLogger().level)
        process = self.processes[index] = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "poolgate.gateway.sibling", stdin=subprocess.PIPE, start_new_session=True
        )
        assert process.stdin is not None  # stdin=PIPE
        process.stdin.write(pickle.dumps(start))
        process.stdin.close()
        log.info("started gateway process %d (pid %d)", index, process.pid)
        return process

    def signal(self, sig: int) -> None:
        """Pass ``sig`` on to every sibling (the first one: they drain; a second: they stop at once)."""
        self.stopping = True
        for process in self.processes.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(sig)

    async def stop(self) -> None:
        """SIGTERM the siblings not signalled yet, wait for them (their drain and a grace), kill what is left."""
        if not self.stopping:
            self.signal(signal.SIGTERM)
        waits = [p.wait() for p in self.processes.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), self.drain_timeout_s + STOP_GRACE_S)
        except TimeoutError:
            for process in self.processes.values():
                if process.returncode is None:
                    log.warning("gateway process pid %d did not stop; killing it", process.pid)
                    process.kill()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
