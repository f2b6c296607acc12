"""The gateway's handle on one local worker process: spawn it, wait until it serves, stop it.

The worker runs as ``python -m poolgate.workers.main`` in its own session (so a Ctrl-C
at the terminal reaches the gateway, which then stops workers in order), with
its stdout and stderr passed straight through so the user sees its progress.
No orphans: ``stop`` sends SIGTERM and SIGKILLs after a grace period, and on
Linux the worker asks the kernel for SIGTERM when the gateway dies (the
gateway must spawn it from the thread that lives as long as the gateway,
i.e. its event loop thread, since the kernel ties that signal to the thread).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys

from poolgate.shared.config import WorkerConfig
from poolgate.shared.errors import Unavailable
from poolgate.shared.transport import WorkerClient
from poolgate.shared.wire import ModelInfo

log = logging.getLogger("poolgate.gateway.local_worker")


class LocalWorker:
    """One spawned worker process and the transport client connected to it."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None
        self.client: WorkerClient | None = None
        self.info: ModelInfo | None = None
        self.address: str | None = None

    async def start(self, cfg: WorkerConfig, address: str, *, ready_timeout: float,
                    runner_factory: str | None = None) -> None:
        """Spawn the worker and return once it answers ``info`` on ``address``."""
        self.address = address
        cmd = [sys.executable, "-m", "poolgate.workers.main", "--listen", address,
               "--config", "-", "--parent-pid", str(os.getpid())]
        if runner_factory is not None:
            cmd += ["--runner-factory", runner_factory]
        log.info("starting worker for %s on %s", cfg.served_model_name, address)
        self.process = await asyncio.create_subprocess_exec(
            *cmd, stdin=subprocess.PIPE, start_new_session=True)
        # the config goes through stdin, not argv: argv is visible to every user (ps), stdin is not
        self.process.stdin.write(json.dumps(cfg.to_wire()).encode())
        self.process.stdin.close()
        try:
            self.client, self.info = await asyncio.wait_for(self._wait_ready(), ready_timeout)
        except asyncio.TimeoutError:
            await self.stop()
            raise Unavailable(f"worker for {cfg.served_model_name} was not ready after {ready_timeout}s") from None
        except BaseException:
            await self.stop()
            raise

    async def _wait_ready(self) -> tuple[WorkerClient, ModelInfo]:
        """Dial until the worker accepts and answers ``info``; fail fast if it exits."""
        exited = asyncio.ensure_future(self.process.wait())
        delay = 0.02
        try:
            while True:
                if exited.done():
                    raise Unavailable(f"worker process exited with code {exited.result()} before it was ready")
                try:
                    client = await WorkerClient.connect(self.address, timeout=5.0)
                except Unavailable:
                    await asyncio.wait([exited], timeout=delay)
                    delay = min(delay * 2, 0.25)
                    continue
                try:
                    return client, await client.info()
                except BaseException:
                    await client.close()
                    raise
        finally:
            exited.cancel()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    async def stop(self, timeout: float = 10) -> int | None:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL; close the client. Returns the exit code."""
        if self.process is not None and self.process.returncode is None:
            try:
                self.process.send_signal(signal.SIGTERM)
                await asyncio.wait_for(self.process.wait(), timeout)
            except ProcessLookupError:
                pass
            except asyncio.TimeoutError:
                log.warning("worker %s ignored SIGTERM for %ss; killing it", self.process.pid, timeout)
                self.process.kill()
            await self.process.wait()
        if self.client is not None:
            await self.client.close()
        return self.process.returncode if self.process is not None else None
