"""Fleet: a config's pools started (local fake workers, remote ones), checked, served, stopped; all or nothing."""
from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from pathlib import Path

import pytest

from poolgate.gateway.pools.fleet import Fleet
from poolgate.gateway.pools.router import Router
from poolgate.shared.config.frozen import GatewayConfig, PoolConfig, WorkerConfig
from poolgate.shared.domain.errors import Conflict, Unavailable
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.engine.runner_api import LoadedModel
from tests.fakes import fake_ids, fake_model, running_worker, tokenized

FAKE = "tests.workers.fake_factory:build"


@contextlib.asynccontextmanager
async def fleet(**config):
    folder = Path(tempfile.mkdtemp(prefix="pg-fleet-"))
    router = Router()
    f = Fleet(GatewayConfig(**{"startup_timeout_s": 10, **config}), router, folder, runner_factory=FAKE)
    try:
        yield f, router
    finally:
        await f.stop()
        await router.close()
        shutil.rmtree(folder, ignore_errors=True)


def local(name: str, replicas: int = 1) -> PoolConfig:
    return PoolConfig(model=name, backend="cpu", workers=(WorkerConfig(model="/unused", served_model_name=name,
                                                                       backend="cpu"),) * replicas)


def on_backend(model: LoadedModel, backend: str) -> LoadedModel:
    return dataclasses.replace(model, info=dataclasses.replace(model.info, backend=backend))


async def call(router: Router, name: str) -> None:
    await router.resolve(name, "embed").submit(tokenized(PoolingCall(request_id="r", model=name, inputs=["a b"])))


async def test_local_and_remote_pools_of_two_models(tmp_path):
    address = f"unix:{tmp_path}/remote.sock"
    async with running_worker(on_backend(fake_model(name="a"), "cuda"), address), fleet(transport="tcp") as (f, router):
        names = await f.start([PoolConfig(model="a", backend="cuda", remotes=(address,)), local("a", 2), local("b")])
        assert names == ["a", "b"] and router.pools["a"].backends == ["cuda", "cpu"]
        assert [len(p.clients) for p in router.pools["a"].pools] == [1, 2]
        assert all(c.address.startswith("tcp://127.0.0.1:") for c in router.pools["a"].pools[1].clients)
        await call(router, "a")
        await call(router, "b")
        assert len(f.running["a"]) == 2 and len(f.running["a"][1].supervisors) == 2
        await f.unload("a", drain_timeout_s=1)
        assert list(router.pools) == ["b"] and "a" not in f.running


async def test_remote_workers_without_a_model_name_are_pooled_by_the_name_they_report(tmp_path):
    models = [fake_model(name="x"), fake_model(name="y"), fake_model(name="x")]
    addresses = [f"unix:{tmp_path}/w{i}.sock" for i in range(3)]
    async with contextlib.AsyncExitStack() as stack:
        for model, address in zip(models, addresses):
            await stack.enter_async_context(running_worker(model, address))
        f, router = await stack.enter_async_context(fleet())
        assert await f.start([PoolConfig(model=None, remotes=tuple(addresses))]) == ["x", "y"]
        assert [len(router.pools[n].clients) for n in ("x", "y")] == [2, 1]


async def test_the_gateway_tokenizes_with_the_workers_files_and_replicas_must_tokenize_alike(tmp_path):
    words = fake_model(name="x")
    alike = dataclasses.replace(words, info=dataclasses.replace(words.info, tokenizer_sha256=words.encoder.files.sha256))
    other = dataclasses.replace(alike, info=dataclasses.replace(alike.info, tokenizer_sha256="0" * 64))
    addresses = [f"unix:{tmp_path}/w{i}.sock" for i in range(3)]
    async with contextlib.AsyncExitStack() as stack:
        for model, address in zip([alike, alike, other], addresses):
            await stack.enter_async_context(running_worker(model, address))
        f, router = await stack.enter_async_context(fleet())
        assert await f.start([PoolConfig(model="x", remotes=tuple(addresses[:2]))]) == ["x"]
        front = router.pools["x"].front
        assert front.encoder.files == words.encoder.files  # the files the worker sent, hash checked
        assert front.prepare(PoolingCall("r", "x", ["a b c"])).call.sequences() == [fake_ids("a b c")]
        await f.unload("x", 1.0)
        with pytest.raises(Unavailable) as refused:
            await f.start([PoolConfig(model="x", remotes=(addresses[0], addresses[2]))])
        assert addresses[0] in str(refused.value) and addresses[2] in str(refused.value)
        assert "different tokenizers" in str(refused.value) and not router.pools


async def test_a_worker_serving_another_model_fails_the_start_and_nothing_is_served(tmp_path):
    address = f"unix:{tmp_path}/other.sock"
    async with running_worker(fake_model(name="other"), address), fleet() as (f, router):
        with pytest.raises(Unavailable, match="serves 'other', not 'a'"):
            await f.start([local("b"), PoolConfig(model="a", remotes=(address,))])
        assert not router.pools and not f.running  # b's worker was stopped again
        await f.start([local("b")])
        with pytest.raises(Conflict, match="already served"):
            await f.start([local("b")])
        assert len(router.pools["b"].clients) == 1


async def test_a_remote_that_never_answers_fails_after_the_start_up_timeout(tmp_path):
    async with fleet(startup_timeout_s=0.3) as (f, router):
        with pytest.raises(Unavailable, match="cannot connect"):
            await f.start([PoolConfig(model="a", remotes=(f"unix:{tmp_path}/nobody.sock",))])
        assert not router.pools


async def test_two_loads_of_one_model_at_once_start_it_once():
    import asyncio

    async with fleet() as (f, router):
        results = await asyncio.gather(f.start([local("b")]), f.start([local("b")]), return_exceptions=True)
        assert sorted(type(r).__name__ for r in results) == ["Conflict", "list"]
        assert len(router.pools["b"].clients) == 1 and len(f.running["b"]) == 1


async def test_remote_workers_are_dialed_with_the_token_over_tls(tmp_path):
    pytest.importorskip("cryptography")
    from poolgate.shared.config.frozen import TransportSecurity
    from poolgate.workers.engine.engine import Engine
    from poolgate.workers.server import serve
    from tests.processes import free_port
    from tests.tls_certs import make_pki

    pki = make_pki(tmp_path / "pki")
    model, port = fake_model(name="a"), free_port()
    engine = Engine(model)
    await engine.start()
    server = await serve(f"tcp://127.0.0.1:{port}", engine, model.info,
                         TransportSecurity(token="tok", tls_cert=pki["cert"], tls_key=pki["key"]))
    try:
        for sec, ok in ((TransportSecurity(token="tok", tls=True, tls_ca=pki["ca"]), True),
                        (TransportSecurity(token="tok"), False),  # plain TCP to a TLS worker
                        (TransportSecurity(token="nope", tls=True, tls_ca=pki["ca"]), False)):
            async with fleet(worker_security=sec, startup_timeout_s=0.5) as (f, router):
                start = f.start([PoolConfig(model="a", remotes=(f"tcp://127.0.0.1:{port}",))])
                if ok:
                    await start
                    await call(router, "a")
                else:
                    with pytest.raises(Unavailable):
                        await start
    finally:
        server.close()
        await engine.stop()
