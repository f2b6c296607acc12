"""A `poolgate serve` of the bundled model as a real process on loopback, for the load and fuzz tests."""
from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.processes import children, free_port, wait_healthy


@dataclass
class LiveServer:
    url: str
    proc: subprocess.Popen
    log: Path  # the server's stderr (gateway and workers)

    def workers(self) -> list[int]:
        return children(self.proc.pid)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def live_server(tmp: Path, *flags: str, ready_s: float = 180):
    """Start ``poolgate serve --port P *flags`` and stop it with SIGTERM on exit (a clean exit is asserted)."""
    port = free_port()
    log = tmp / f"serve-{port}.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--host", "127.0.0.1",
                                 "--port", str(port), *flags], stdout=subprocess.DEVNULL, stderr=err)
    server = LiveServer(f"http://127.0.0.1:{port}", proc, log)
    try:
        try:
            wait_healthy(server.url, ready_s, proc)
        except (AssertionError, TimeoutError) as err:
            raise AssertionError(f"{err}\n{server.log_text()[-3000:]}") from None
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
