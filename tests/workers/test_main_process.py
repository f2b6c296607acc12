"""A real worker process (fake runner) spawned and stopped through gateway.pools.local_worker.LocalWorker."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.errors import Unavailable
from poolgate.shared.wire.messages import PoolingCall
from poolgate.gateway.pools.local_worker import LocalWorker
from tests.fakes import expected_vector, fake_vector, tokenized
from tests.processes import alive, free_port

FACTORY = "tests.workers.fake_factory:build"
CFG = WorkerConfig(model="unused", served_model_name="proc-model", max_model_len=16)


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="pg-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("kind", ["unix", "tcp"])
async def test_spawn_pool_and_stop(sock_dir, kind):
    sock = os.path.join(sock_dir, "w.sock")
    address = f"unix:{sock}" if kind == "unix" else f"tcp://127.0.0.1:{free_port()}"
    worker = LocalWorker()
    await worker.start(CFG, address, ready_timeout=30, runner_factory=FACTORY)
    try:
        assert worker.info.served_model_name == "proc-model" and worker.info.max_model_len == 16
        result = await worker.client.pool(tokenized(PoolingCall("r1", "proc-model", ["hello there", [3, 4]])))
        assert result.outputs.item(0).tobytes() == expected_vector("hello there").tobytes()
        assert result.outputs.item(1).tobytes() == fake_vector([3, 4]).tobytes()
        assert (await worker.client.health())["ready"] is True
        assert os.path.exists(sock) == (kind == "unix")
    finally:
        code = await worker.stop(timeout=5)
    assert code == 0  # a clean exit on SIGTERM, not a kill
    assert not alive(worker.pid)
    assert not os.path.exists(sock)
    with pytest.raises(Unavailable):
        await worker.client.info()


async def test_worker_that_fails_to_load_is_reported(sock_dir):
    worker = LocalWorker()
    with pytest.raises(Unavailable, match="exited with code 1"):
        await worker.start(CFG, f"unix:{sock_dir}/w.sock", ready_timeout=30,
                           runner_factory="tests.workers.fake_factory:fail")


async def test_bad_factory_is_a_usage_error(sock_dir):
    worker = LocalWorker()
    with pytest.raises(Unavailable, match="exited with code 2"):
        await worker.start(CFG, f"unix:{sock_dir}/w.sock", ready_timeout=30, runner_factory="no_colon")


async def test_ready_timeout_kills_the_worker(sock_dir):
    worker = LocalWorker()
    started = time.monotonic()
    with pytest.raises(Unavailable, match="not ready after 1"):
        await worker.start(CFG, f"unix:{sock_dir}/w.sock", ready_timeout=1,
                           runner_factory="tests.workers.fake_factory:hang")
    assert time.monotonic() - started < 10
    assert worker.process.returncode is not None and not alive(worker.pid)


PARENT = textwrap.dedent("""
    import asyncio, sys
    from poolgate.gateway.pools.local_worker import LocalWorker
    from poolgate.shared.config.frozen import WorkerConfig

    async def main():
        worker = LocalWorker()
        cfg = WorkerConfig(model="unused", served_model_name="orphan-check")
        await worker.start(cfg, sys.argv[1], ready_timeout=30, runner_factory=sys.argv[2])
        print(worker.pid, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_worker_dies_with_a_killed_gateway(sock_dir):
    sock = os.path.join(sock_dir, "w.sock")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, f"unix:{sock}", FACTORY],
                              stdout=subprocess.PIPE, text=True)
    try:
        worker_pid = int(parent.stdout.readline())
        assert alive(worker_pid)
    finally:
        parent.send_signal(signal.SIGKILL)  # no chance to clean up: only the kernel can help
        parent.wait()
    deadline = time.monotonic() + 10
    while alive(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker_pid)
    assert not os.path.exists(sock)  # it even shut down cleanly on the SIGTERM


async def test_the_config_and_its_secrets_stay_out_of_the_worker_command_line(sock_dir):
    from poolgate.shared.config.frozen import TracingConfig

    secret = "Bearer s3cr3t-token"
    cfg = WorkerConfig(model="unused", served_model_name="proc-model", max_model_len=16,
                       tracing=TracingConfig("http://127.0.0.1:9/v1/traces", headers=(("authorization", secret),)))
    worker = LocalWorker()
    await worker.start(cfg, f"unix:{sock_dir}/w.sock", ready_timeout=30, runner_factory=FACTORY)
    try:
        with open(f"/proc/{worker.pid}/cmdline", "rb") as f:
            argv = f.read().decode()
        assert "s3cr3t" not in argv and "served_model_name" not in argv
        assert worker.info.served_model_name == "proc-model"  # the config did arrive
    finally:
        assert await worker.stop(timeout=5) == 0
