"""Keeps local worker processes serving: start them, restart the ones that die with backoff, rejoin pools.

One ``Supervisor`` per local worker. ``start_all`` starts them together; a
worker that fails to start is logged and retried in the background (whether a
pool can start with the workers that came up is ``gateway.pools.fleet``'s call). Once
the pools exist, ``attach`` hands each supervisor its pool and ``run`` watches
the process:

- it exits (a crash, an OOM kill, SIGKILL): its pool member goes ``starting``
  at once (the calls on it fail over to another replica), and after a backoff
  (0.5 s, doubling up to 30 s; back to 0.5 s once a worker stayed up 60 s) it
  is started again on the same kind of address;
- it is ready again: it takes its old place in the pool (``WorkerPool.replace``),
  or joins it (``add``) when it never came up before;
- it hangs (alive, but its pool has had it down, failing health checks, for
  ``hung_kill_after_s``): it gets SIGKILL, and the restart above follows.

The environment of each process comes from a ``WorkerEnv``: a function of the
worker's config, which already holds its placement (device, CPU affinity),
returning the variables to add (``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``,
``ZE_AFFINITY_MASK``, thread counts). ``shared.config.backends.worker_env`` is the one
the gateway uses; ``no_extra_env`` adds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from poolgate.gateway.pools import loras
from poolgate.gateway.pools.local_worker import LocalWorker
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.wire.transport import WorkerClient

log = logging.getLogger("poolgate.gateway.pools.supervisor")

HUNG_KILL_AFTER_S = 30.0  # a local worker down (alive, not answering) this long is killed and restarted
WorkerEnv = Callable[[WorkerConfig], Mapping[str, str]]


def no_extra_env(cfg: WorkerConfig) -> Mapping[str, str]:
    return {}


@dataclass(frozen=True)
class Backoff:
    """Delay before restart number ``n`` (1, 2, ...) since the worker last stayed up ``reset_after_s``."""

    first_s: float = 0.5
    max_s: float = 30.0
    reset_after_s: float = 60.0

    def delay(self, n: int) -> float:
        return min(self.first_s * 2 ** max(n - 1, 0), self.max_s)


class Supervisor:
    """One local worker kept running (see the module doc)."""

    def __init__(
        self,
        cfg: WorkerConfig,
        address: str,
        index: int = 0,
        *,
        ready_timeout: float,
        env: WorkerEnv = no_extra_env,
        backoff: Backoff = Backoff(),
        runner_factory: str | None = None,
        hung_kill_after_s: float | None = HUNG_KILL_AFTER_S,
    ) -> None:
        self.cfg, self.address, self.index = cfg, address, index
        self.ready_timeout, self.env, self.backoff = ready_timeout, env, backoff
        self.runner_factory, self.hung_kill_after_s = runner_factory, hung_kill_after_s
        self.worker: LocalWorker | None = None  # the running incarnation; None while there is none
        self.pool: WorkerPool | None = None
        self.member: WorkerClient | None = None  # the client that stands for this worker in its pool
        self.restarts = 0  # incarnations started after the first
        self.failures = 0  # failed starts and exits since the worker last stayed up
        self.stopping = False
        self.error: str | None = None  # why the last start failed
        self._up_since = 0.0
        self._task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.cfg.served_model_name

    async def start(self) -> LocalWorker:
        """Start one incarnation and wait until it is ready (raises if it is not)."""
        worker = LocalWorker(self.env(self.cfg))
        await worker.start(self.cfg, self.address, ready_timeout=self.ready_timeout, runner_factory=self.runner_factory)
        self.worker, self._up_since, self.error = worker, time.monotonic(), None
        return worker

    def attach(self, pool: WorkerPool | None) -> None:
        """The pool this worker serves in (None: its model has no pool; the worker will not rejoin)."""
        self.pool = pool
        self.member = self.worker.client if pool is not None and self.worker is not None else None

    async def run(self) -> None:
        """Forever (until cancelled or ``stop``): restart the worker whenever it is not running."""
        self._task = asyncio.current_task()
        while not self.stopping:
            if (worker := self.worker) is not None:
                code = await self._exited(worker)
                if self.stopping:  # ``stop`` ran meanwhile (mypy keeps the loop test's narrowing across the await)
                    return  # type: ignore[unreachable]
                self._lost(worker, code)
            await asyncio.sleep(self.backoff.delay(self.failures))
            await self._restart()

    async def _exited(self, worker: LocalWorker) -> int:
        """The process's exit code once it exits; SIGKILL it first if it hangs (module doc)."""
        process = worker.process
        assert process is not None  # a worker is kept only once started
        exited = asyncio.ensure_future(process.wait())
        try:
            while not (await asyncio.wait({exited}, timeout=0.5))[0]:
                self._kill_if_hung(process)
            return exited.result()
        finally:
            exited.cancel()

    def _kill_if_hung(self, process: asyncio.subprocess.Process) -> None:
        if self.hung_kill_after_s is None or self.pool is None or self.member not in self.pool.clients:
            return
        down = self.pool.down_for(self.member)
        if down >= self.hung_kill_after_s and process.returncode is None:
            log.warning(
                "worker %d of %s (pid %d) has not answered for %.1fs; killing it",
                self.index,
                self.name,
                process.pid,
                down,
            )
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                process.kill()

    def _lost(self, worker: LocalWorker, code: int | None) -> None:
        if time.monotonic() - self._up_since >= self.backoff.reset_after_s:
            self.failures = 0
        self.failures += 1
        delay = self.backoff.delay(self.failures)
        reason = f"worker process {worker.pid} exited with code {code}; restarting in {delay:g}s"
        log.warning("worker %d of %s: %s", self.index, self.name, reason)
        if self.pool is not None and self.member in self.pool.clients:
            self.pool.set_state(self.member, "starting", reason)
        self.worker = None

    async def _restart(self) -> None:
        try:
            new = await self.start()
        except Exception as exc:  # Unavailable (exited, not ready in time) or a spawn error: try again later
            self.failures, self.error = self.failures + 1, str(exc)
            log.warning(
                "worker %d of %s did not come back: %s (next try in %gs)",
                self.index,
                self.name,
                exc,
                self.backoff.delay(self.failures),
            )
            return
        self.restarts += 1
        log.info(
            "worker %d of %s is back (restart %d, pid %d) on %s",
            self.index,
            self.name,
            self.restarts,
            new.pid,
            new.address,
        )
        if self.pool is None or new.client is None:
            return
        await loras.restore(self.pool, new.client)  # its pool's run-time LoRA adapters, before it takes calls
        old, self.member = self.member, new.client
        if old is not None and old in self.pool.clients:
            self.pool.replace(old, new.client)
            await old.close()
        else:
            self.pool.add(new.client)

    async def stop(self) -> None:
        """Stop supervising (a start under way is abandoned) and stop the running process."""
        self.stopping = True
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            await asyncio.wait([self._task])
        if self.worker is not None:
            await self.worker.stop()


async def start_all(supervisors: Sequence[Supervisor]) -> list[Exception]:
    """Start every worker at once; each failure is recorded on its supervisor and logged (``run`` retries it in
    the background). Returns the failures, in order."""
    results = await asyncio.gather(*(s.start() for s in supervisors), return_exceptions=True)
    errors = []
    for sup, result in zip(supervisors, results, strict=True):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result
            sup.failures, sup.error = 1, str(result)
            log.error("worker %d of %s failed to start: %s", sup.index, sup.name, result)
            errors.append(result)
    return errors
