"""Runner factories for worker-process tests: ``--runner-factory tests.workers.fake_factory:build``
(each returns a ``LoadedModel``, like ``poolgate.workers.load.build:load_model``)."""
from __future__ import annotations

import time

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.engine.runner_api import LoadedModel
from tests.fakes import fake_model


def build(cfg: WorkerConfig) -> LoadedModel:
    """A fake model named after the config, honouring its max_model_len."""
    return fake_model(name=cfg.served_model_name, max_model_len=cfg.max_model_len or 32)


def fail(cfg: WorkerConfig) -> LoadedModel:
    """A factory whose model never loads: the worker must exit non-zero."""
    raise RuntimeError(f"cannot load {cfg.model}")


def hang(cfg: WorkerConfig) -> LoadedModel:
    """A factory that never finishes loading: the gateway's ready timeout must fire."""
    time.sleep(600)
    raise AssertionError("unreachable")


def slow(cfg: WorkerConfig) -> LoadedModel:
    """As ``build``, but every batch takes 0.5 s on the "device" (calls stay in flight a while)."""
    model = build(cfg)
    model.runner.execute_delay = 0.5
    return model


def from_env(cfg: WorkerConfig) -> LoadedModel:
    """As ``build``, named after $POOLGATE_TEST_NAME (shows the environment a worker was given)."""
    import os

    return fake_model(name=os.environ.get("POOLGATE_TEST_NAME", "no-env"), max_model_len=cfg.max_model_len or 32)


def paced(cfg: WorkerConfig) -> LoadedModel:
    """As ``build``, but every batch takes 0.05 s (under load, calls are always in flight)."""
    model = build(cfg)
    model.runner.execute_delay = 0.05
    return model


def fail_once(cfg: WorkerConfig) -> LoadedModel:
    """The first worker to load ``cfg.model`` (a folder) fails; every later one is ``build``."""
    import os

    try:
        os.close(os.open(os.path.join(cfg.model, "failed-once"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return build(cfg)
    raise RuntimeError("this worker fails (the first one only)")
