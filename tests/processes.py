"""Helpers for tests that run poolgate as real processes: free ports, liveness, readiness."""
from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def health_status(url: str) -> int | None:
    """``GET url/health``'s status, or None while nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return None


def wait_healthy(url: str, timeout_s: float = 30, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url/health`` until 200; fail early if ``proc`` (the server) exits."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(proc.stderr.read() if proc.stderr else f"server exited with {proc.returncode}")
        if health_status(url) == 200:
            return
        time.sleep(0.25)
    raise TimeoutError(f"{url} never became ready")
