"""Router: model name and task -> the model's pools, the default model, readiness, models added and removed."""
from __future__ import annotations

import dataclasses

import pytest

from poolgate.gateway.pools.pool import WorkerPool
from poolgate.gateway.pools.router import Router
from poolgate.shared.domain.errors import InvalidRequest, ModelNotFound, NotSupported
from tests.fakes import FakeWorkerClient, fake_model


def pool(name: str, *, ready: bool = True, tasks: tuple[str, ...] = ("embed",), backend: str = "cpu") -> WorkerPool:
    info = dataclasses.replace(fake_model(name=name).info, tasks=tasks, backend=backend)
    return WorkerPool(info, [FakeWorkerClient(info)], ready=ready)


def test_resolves_by_name_and_defaults_to_the_only_model():
    only = pool("m1")
    router = Router([only])
    assert router.resolve("m1", "embed").pools == [only]
    assert router.resolve(None, "embed").pools == [only]
    assert router.resolve("", "embed").pools == [only]


def test_unknown_model_has_vllms_message():
    with pytest.raises(ModelNotFound) as info:
        Router([pool("m1")]).resolve("nope", "embed")
    assert info.value.message == "The model `nope` does not exist."
    assert info.value.status == 404


def test_several_models_need_a_name_or_a_default():
    a, b = pool("a"), pool("b")
    with pytest.raises(InvalidRequest, match="serves several models"):
        Router([a, b]).resolve(None, "embed")
    assert Router([a, b], default="b").resolve(None, "embed").pools == [b]
    assert Router([a, b]).resolve("a", "embed").pools == [a]


def test_task_the_model_does_not_serve_is_501():
    router = Router([pool("clf", tasks=("classify",))])
    with pytest.raises(NotSupported, match="does not support Embeddings API"):
        router.resolve("clf", "embed")
    assert router.resolve("clf", "classify").name == "clf"


def test_lookup_finds_the_model_whatever_its_tasks():
    clf = pool("clf", tasks=("classify",))
    router = Router([clf])
    assert router.lookup("clf").pools == [clf] and router.lookup(None).pools == [clf]
    with pytest.raises(ModelNotFound):
        router.lookup("nope")


def test_bad_construction_is_refused():
    with pytest.raises(ValueError, match="already has a pool on backend 'cpu'"):
        Router([pool("a"), pool("a")])
    with pytest.raises(ValueError, match="not served"):
        Router([pool("a")], default="b")


def test_empty_router_serves_nothing_and_is_not_ready():
    router = Router([])
    assert not router.ready and router.models() == []
    with pytest.raises(ModelNotFound):
        router.resolve(None, "embed")


def test_ready_when_every_pool_has_a_ready_worker():
    a, b = pool("a"), pool("b", ready=False)
    router = Router([a, b])
    assert not router.ready
    b.mark_ready(b.clients[0])
    assert router.ready
    assert [info.served_model_name for info in router.models()] == ["a", "b"]


def test_a_second_pool_of_a_model_is_its_overflow_pool():
    cuda, cpu = pool("m", backend="cuda"), pool("m")
    router = Router([cuda, cpu])
    assert router.resolve("m", "embed").pools == [cuda, cpu] and list(router.worker_pools()) == [cuda, cpu]
    assert router.resolve("m", "embed").backends == ["cuda", "cpu"] and router.default == "m"
    with pytest.raises(ValueError, match="differs from its cuda pool in tasks"):
        router.add(pool("m", backend="xpu", tasks=("classify",)))


def test_models_are_added_and_removed_at_run_time():
    router = Router([pool("a")])
    router.add(pool("b"))
    assert router.default is None and sorted(router.pools) == ["a", "b"]
    removed = router.remove("a")
    assert removed.name == "a" and list(router.pools) == ["b"] and router.default == "b"
    with pytest.raises(ModelNotFound):
        router.remove("a")
