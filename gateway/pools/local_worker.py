"""The gateway's handle on one local worker process: spawn it, wait until it serves, stop it.

The worker runs as ``python -m poolgate.workers.main`` in its own session (so a Ctrl-C
at the terminal reaches the gateway, which then stops workers in order), with
its stdout and stderr passed straight through so the user sees its progress.

No port race: the gateway never picks a TCP port for a worker. A ``tcp://host:0``
address makes the worker bind a free port itself; every worker reports the
address it is serving on through a pipe (``--report-fd``) once its listener is
up, and that line is also its "ready" signal (EOF first = it exited before it
was ready). Unix socket paths are chosen by the gateway in its private folder.

No strangers: a worker started without a token gets a random one (through
stdin, with the rest of its config), which the gateway's client presents.

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
import secrets
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import IO

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.errors import Unavailable
from poolgate.shared.wire.messages import ModelInfo
from poolgate.shared.wire.transport import WorkerClient

log = logging.getLogger("poolgate.gateway.pools.local_worker")


class LocalWorker:
    """One spawned worker process and the transport client connected to it.

    ``env``: variables added to the gateway's environment for this process (the
    backend's device selection and CPU pinning, from ``gateway.pools.supervisor.WorkerEnv``).
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(env or {})
        self.process: asyncio.subprocess.Process | None = None
        self.client: WorkerClient | None = None
        self.info: ModelInfo | None = None
        self.address: str | None = None  # where it serves, as it reported it

    async def start(
        self, cfg: WorkerConfig, address: str, *, ready_timeout: float, runner_factory: str | None = None
    ) -> None:
        """Spawn the worker listening on ``address`` (``tcp://host:0``: a port it picks) and return once
        it reported its address and answered ``info`` there."""
        if cfg.security.token is None:  # a fresh token per process: nobody else can use our worker's port
            cfg = replace(cfg, security=replace(cfg.security, token=secrets.token_urlsafe(32)))
        read_fd, write_fd = os.pipe()
        cmd = [
            sys.executable,
            "-m",
            "poolgate.workers.main",
            "--listen",
            address,
            "--report-fd",
            str(write_fd),
            "--config",
            "-",
            "--parent-pid",
            str(os.getpid()),
        ]
        if runner_factory is not None:
            cmd += ["--runner-factory", runner_factory]
        log.info("starting worker for %s on %s", cfg.served_model_name, address)
        report = os.fdopen(read_fd, "rb", buffering=0)  # closed below, or once the worker reported
        try:
            process = self.process = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(write_fd,),
                env={**os.environ, **self.env} if self.env else None,
            )
        except BaseException:
            report.close()
            raise
        finally:
            os.close(write_fd)
        # the config goes through stdin, not argv: argv is visible to every user (ps), stdin is not
        assert process.stdin is not None  # stdin=PIPE
        process.stdin.write(json.dumps(cfg.to_wire()).encode())
        process.stdin.close()
        try:
            self.client, self.info = await asyncio.wait_for(self._wait_ready(process, report, cfg), ready_timeout)
        except TimeoutError:
            await self.stop()
            raise Unavailable(f"worker for {cfg.served_model_name} was not ready after {ready_timeout}s") from None
        except BaseException:
            await self.stop()
            raise
        finally:
            report.close()

    async def _wait_ready(
        self, process: asyncio.subprocess.Process, report: IO[bytes], cfg: WorkerConfig
    ) -> tuple[WorkerClient, ModelInfo]:
        """Read the address line from the pipe (EOF: the worker exited first), then connect there."""
        line = await _read_line(report)
        if not line:
            code = await process.wait()
            raise Unavailable(f"worker process exited with code {code} before it was ready")
        self.address = line
        # the gateway's own client presents the token the worker was given
        client = await WorkerClient.connect(self.address, timeout=5.0, token=cfg.security.token)
        try:
            return client, await client.info()
        except BaseException:
            await client.close()
            raise

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
            except TimeoutError:
                log.warning("worker %s ignored SIGTERM for %ss; killing it", self.process.pid, timeout)
                self.process.kill()
            await self.process.wait()
        if self.client is not None:
            await self.client.close()
        return self.process.returncode if self.process is not None else None


async def _read_line(pipe: IO[bytes]) -> str:
    """One line from the read end ``pipe`` (a file; closed afterwards), without blocking the loop; "" at EOF."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        return (await reader.readline()).decode().strip()
    finally:
        transport.close()
