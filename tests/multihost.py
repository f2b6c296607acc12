"""The multi-host scenario, run by tests/test_multihost.py inside ``unshare --user --map-root-user --net --mount``.

``python -m tests.multihost setup`` (as root of the new namespaces) creates three
network namespaces joined by veth pairs: ``pg-gw`` (10.77.1.1, 10.77.2.1) and
the two "hosts" ``pg-w1`` (10.77.1.2) and ``pg-w2`` (10.77.2.2); then runs
``python -m tests.multihost run`` inside ``pg-gw``, which:

1. starts ``poolgate worker`` (fake runner, a token file) in each worker
   namespace, listening on its veth address, port 9100;
2. starts ``poolgate serve --config`` in ``pg-gw`` with both as
   ``[[models.remote]]`` and ``worker_token_file``: real TCP between namespaces;
3. sends embeddings requests from 8 concurrent clients for ``--seconds``; kills
   worker 1 with SIGKILL a quarter of the way in and starts it again at the
   half; waits until ``/admin/pools`` shows both workers ready;
4. prints one JSON line: requests sent, failed (with the first errors), and the
   seconds from the restart until the pool was whole.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

NAMESPACES = {"pg-w1": ("10.77.1.1", "10.77.1.2"), "pg-w2": ("10.77.2.1", "10.77.2.2")}  # ns: (gateway side, worker)
GATEWAY_NS, PORT, HTTP_PORT, MODEL, KEY = "pg-gw", 9100, 8000, "fake-model", "sk-multihost"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True)


def setup() -> int:
    """Namespaces and links (needs CAP_SYS_ADMIN + CAP_NET_ADMIN in this user namespace), then ``run`` in pg-gw."""
    Path("/run/netns").mkdir(parents=True, exist_ok=True)
    sh("mount", "-t", "tmpfs", "tmpfs", "/run/netns")
    sh("ip", "netns", "add", GATEWAY_NS)
    sh("ip", "-n", GATEWAY_NS, "link", "set", "lo", "up")
    for i, (ns, (gw_ip, w_ip)) in enumerate(NAMESPACES.items(), 1):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", f"gw{i}", "netns", GATEWAY_NS, "type", "veth", "peer", "name", f"w{i}", "netns", ns)
        sh("ip", "-n", GATEWAY_NS, "addr", "add", f"{gw_ip}/24", "dev", f"gw{i}")
        sh("ip", "-n", ns, "addr", "add", f"{w_ip}/24", "dev", f"w{i}")
        for n, dev in ((GATEWAY_NS, f"gw{i}"), (ns, f"w{i}"), (ns, "lo")):
            sh("ip", "-n", n, "link", "set", dev, "up")
    return subprocess.run(["ip", "netns", "exec", GATEWAY_NS, sys.executable, "-m", "tests.multihost", "run",
                           *sys.argv[2:]]).returncode


def start_worker(ns: str, ip: str, token_file: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "poolgate.gateway.cli", "worker", "--served-model-name",
         MODEL, "--listen", f"tcp://{ip}:{PORT}", "--token-file", str(token_file),
         "--runner-factory", "tests.workers.fake_factory:build"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT)


def write_config(folder: Path) -> Path:
    remotes = "".join(f'[[models.remote]]\nurl = "tcp://{w_ip}:{PORT}"\n' for _, w_ip in NAMESPACES.values())
    path = folder / "gateway.toml"
    path.write_text(f'port = {HTTP_PORT}\napi_key = "{KEY}"\nworker_token_file = "token"\n'
                    f'request_timeout = 30\n\n[[models]]\nname = "{MODEL}"\n{remotes}')
    return path


async def admin_workers(session: aiohttp.ClientSession, url: str) -> list[dict]:
    async with session.get(f"{url}/admin/pools", headers={"Authorization": f"Bearer {KEY}"}) as resp:
        body = await resp.json()
    return [w for model in body["data"] for pool in model["pools"] for w in pool["workers"]]


async def admin_states(session: aiohttp.ClientSession, url: str) -> list[str]:
    return [w["state"] for w in await admin_workers(session, url)]


async def load(url: str, seconds: float, kill, restart) -> dict:
    sent, failed, errors = 0, 0, []
    stop = time.monotonic() + seconds

    async def client(session: aiohttp.ClientSession, k: int) -> None:
        nonlocal sent, failed
        while time.monotonic() < stop:
            sent += 1
            try:
                async with session.post(f"{url}/v1/embeddings", headers={"Authorization": f"Bearer {KEY}"},
                                        json={"model": MODEL, "input": [f"client {k} text {sent}", "two words"]}) as r:
                    if r.status != 200:
                        failed += 1
                        errors.append(f"{r.status} {await r.text()}"[:300])
                    else:
                        await r.read()
            except aiohttp.ClientError as exc:
                failed += 1
                errors.append(repr(exc)[:300])

    async with aiohttp.ClientSession() as session:
        clients = [asyncio.create_task(client(session, k)) for k in range(8)]
        await asyncio.sleep(seconds / 4)
        kill()
        await asyncio.sleep(seconds / 4)
        restarted = time.monotonic()
        restart()
        whole_s = None
        while whole_s is None and time.monotonic() < restarted + 60:
            if await admin_states(session, url) == ["ready", "ready"]:
                whole_s = round(time.monotonic() - restarted, 2)
            else:
                await asyncio.sleep(0.05)
        await asyncio.gather(*clients)
        final = await admin_workers(session, url)
    return {"sent": sent, "failed": failed, "errors": errors[:5], "whole_after_restart_s": whole_s,
            "final_states": [w["state"] for w in final], "recoveries": {w["address"]: w["recoveries"] for w in final}}


def run(seconds: float) -> int:
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="pg-multihost-") as tmp:
        folder = Path(tmp)
        (folder / "token").write_text("multihost-secret\n")
        os.chmod(folder / "token", 0o600)
        logs = folder / "logs.txt"
        workers = {ns: start_worker(ns, w_ip, folder / "token", logs) for ns, (_, w_ip) in NAMESPACES.items()}
        procs += workers.values()
        gateway = subprocess.Popen([sys.executable, "-m", "poolgate.gateway.cli", "serve", "--config",
                                    str(write_config(folder))], stdout=logs.open("ab"), stderr=subprocess.STDOUT)
        procs.append(gateway)
        try:
            url = f"http://127.0.0.1:{HTTP_PORT}"
            _wait_healthy(url, gateway)

            def kill() -> None:
                os.kill(workers["pg-w1"].pid, signal.SIGKILL)  # ip netns exec execs: the pid is the worker's
                workers["pg-w1"].wait()

            def restart() -> None:
                workers["pg-w1"] = start_worker("pg-w1", NAMESPACES["pg-w1"][1], folder / "token", logs)
                procs.append(workers["pg-w1"])

            result = asyncio.run(load(url, seconds, kill, restart))
        finally:
            for proc in reversed(procs):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        result["log_tail"] = logs.read_text()[-3000:] if result.get("failed") or not result.get("whole_after_restart_s") \
            else ""
    print(json.dumps(result))
    return 0


def _wait_healthy(url: str, gateway: subprocess.Popen, timeout_s: float = 60) -> None:
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if gateway.poll() is not None:
            raise SystemExit(f"gateway exited with {gateway.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("gateway never became healthy")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("stage", choices=("setup", "run"))
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    sys.exit(setup() if args.stage == "setup" else run(args.seconds))
