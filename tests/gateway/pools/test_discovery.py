"""DNS discovery (dns+tcp://): workers join and leave a pool as a (fake) resolver's answer changes;
the Fleet dials them with the gateway's token."""
from __future__ import annotations

import asyncio
import contextlib
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from poolgate.gateway.pools.discovery import Discovery, check_url, parse_dns_url, resolve_host
from poolgate.gateway.pools.fleet import Fleet
from poolgate.gateway.pools.router import Router
from poolgate.shared.config.frozen import GatewayConfig, PoolConfig, TransportSecurity
from poolgate.shared.domain.errors import Unavailable
from poolgate.shared.wire.transport import WorkerClient
from poolgate.shared.wire.messages import PoolingCall
from tests.fakes import FakeDns, FakeWorkerClient, fake_model, tokenized, until
from tests.processes import free_port

TOKEN = "t0ken"


@contextlib.asynccontextmanager
async def workers(port: int, hosts: dict[str, str], token: str | None = TOKEN):
    """Real workers (Engine + transport server, fake runner) on ``host:port``, serving ``hosts[host]``."""
    from poolgate.workers.engine.engine import Engine
    from poolgate.workers.server import serve

    async with contextlib.AsyncExitStack() as stack:
        for host, name in hosts.items():
            model = fake_model(name=name)
            engine = Engine(model)
            await engine.start()
            stack.push_async_callback(engine.stop)
            server = await serve(f"tcp://{host}:{port}", engine, model.info, TransportSecurity(token=token))
            stack.callback(server.close)
        yield


def test_urls():
    assert parse_dns_url("dns+tcp://poolgate-workers.default.svc:9100").worker_url("10.1.2.3") == "tcp://10.1.2.3:9100"
    assert parse_dns_url("dns+tcp://w:1").worker_url("fd00::1") == "tcp://[fd00::1]:1"
    for bad in ("dns+tcp://w", "dns+tcp://:1", "dns+tcp://w:0", "dns+tcp://w:x", "dns://w:1"):
        with pytest.raises(ValueError):
            check_url(bad)
    assert check_url("tcp://h:1") == "tcp://h:1" and check_url("unix:/x.sock") == "unix:/x.sock"


async def test_the_system_resolver_finds_localhost():
    assert "127.0.0.1" in await resolve_host("localhost", 80)


@contextlib.asynccontextmanager
async def fleet_with(dns: FakeDns, port: int, *, token: str | None = TOKEN):
    config = GatewayConfig(worker_security=TransportSecurity(token=token), startup_timeout_s=5)
    router = Router()
    with tempfile.TemporaryDirectory(prefix="pg-dns-") as folder:
        fleet = Fleet(config, router, Path(folder), resolver=dns, discovery_interval_s=0.05)
        try:
            yield fleet, router
        finally:
            await fleet.stop()
            await router.close()


async def test_workers_join_and_leave_as_dns_changes():
    port, dns = free_port(), FakeDns("127.0.0.2")
    hosts = {"127.0.0.2": "fake-model", "127.0.0.3": "fake-model", "127.0.0.4": "other-model"}
    async with workers(port, hosts), fleet_with(dns, port) as (fleet, router):
        url = f"dns+tcp://workers.test:{port}"
        assert await fleet.start([PoolConfig(model="fake-model", remotes=(url,))]) == ["fake-model"]
        model = router.pools["fake-model"]
        assert [c.address for c in model.clients] == [f"tcp://127.0.0.2:{port}"]
        assert dns.asked[0] == ("workers.test", port)

        dns.addresses = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]  # .4 serves another model: never added
        await until(lambda: len(model.clients) == 2)
        assert sorted(c.address for c in model.clients) == [f"tcp://127.0.0.{i}:{port}" for i in (2, 3)]
        for i in range(4):
            await model.submit(tokenized(PoolingCall(request_id=f"r{i}", model="fake-model", inputs=["a b"])))

        first = model.clients[0]
        dns.addresses = ["127.0.0.3"]
        await until(lambda: len(model.clients) == 1)
        assert model.clients[0].address == f"tcp://127.0.0.3:{port}" and not first.connected

        dns.fail = True  # a failed lookup keeps the workers
        asked = len(dns.asked)
        await until(lambda: len(dns.asked) > asked + 2)
        assert len(model.clients) == 1 and model.ready


async def test_a_dns_only_pool_waits_for_its_first_worker_and_uses_the_token():
    port, dns = free_port(), FakeDns()
    async with fleet_with(dns, port) as (fleet, router):
        start = asyncio.create_task(fleet.start([PoolConfig(model="fake-model",
                                                            remotes=(f"dns+tcp://w.test:{port}",))]))
        await until(lambda: len(dns.asked) >= 2)
        assert not start.done()
        async with workers(port, {"127.0.0.5": "fake-model"}):
            dns.addresses = ["127.0.0.5"]
            assert await asyncio.wait_for(start, 5) == ["fake-model"]
            assert router.resolve("fake-model", "embed").ready


async def test_a_wrong_token_never_joins():
    port, dns = free_port(), FakeDns("127.0.0.6")
    async with workers(port, {"127.0.0.6": "fake-model"}), fleet_with(dns, port, token="wrong") as (fleet, router):
        discovery = Discovery(f"dns+tcp://w:{port}", fleet.connect, resolver=dns)
        assert await discovery.sync(expected="fake-model") == ([], [])
        with pytest.raises(Unavailable):
            await WorkerClient.connect(f"tcp://127.0.0.6:{port}", token="wrong")


class _DropsBeforeInfo:
    """A worker that accepts the connection, then drops it before answering ``info``."""

    def __init__(self, address: str):
        self.address, self.closed = address, False

    async def info(self):
        raise Unavailable(f"worker at {self.address}: connection lost")

    async def close(self) -> None:
        self.closed = True


async def test_a_worker_that_drops_before_info_does_not_stop_discovery():
    dropped: list[_DropsBeforeInfo] = []

    async def connect(url: str):
        dropped.append(_DropsBeforeInfo(url))
        return dropped[-1]

    discovery = Discovery("dns+tcp://workers.test:9100", connect, resolver=FakeDns("127.0.0.2"), interval_s=0.01)
    for _ in range(2):  # every round tries it again; none raises
        assert await discovery.sync(expected="m") == ([], [])
    assert len(dropped) == 2 and all(c.closed for c in dropped) and discovery.members == {}


async def test_a_worker_with_another_tokenizer_is_not_added():
    info = fake_model(name="m").info
    clients = {"tcp://127.0.0.2:9100": FakeWorkerClient(replace(info, tokenizer_sha256="a" * 64)),
               "tcp://127.0.0.3:9100": FakeWorkerClient(replace(info, tokenizer_sha256="b" * 64))}

    async def connect(url: str):
        return clients[url]

    discovery = Discovery("dns+tcp://workers.test:9100", connect, resolver=FakeDns("127.0.0.2", "127.0.0.3"),
                          interval_s=0.01)
    added, _ = await discovery.sync(expected="m", tokenizer="a" * 64)
    assert added == [clients["tcp://127.0.0.2:9100"]] and clients["tcp://127.0.0.3:9100"].closed
