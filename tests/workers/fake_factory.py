"""Runner factories for worker-process tests: ``--runner-factory tests.workers.fake_factory:build``."""
from __future__ import annotations

import time

from poolgate.shared.config import WorkerConfig
from tests.conftest import FakeRunner


def build(cfg: WorkerConfig) -> FakeRunner:
    """A FakeRunner named after the config, honouring its max_model_len."""
    return FakeRunner(name=cfg.served_model_name, max_model_len=cfg.max_model_len or 32)


def fail(cfg: WorkerConfig) -> FakeRunner:
    """A factory whose model never loads: the worker must exit non-zero."""
    raise RuntimeError(f"cannot load {cfg.model_path}")


def hang(cfg: WorkerConfig) -> FakeRunner:
    """A factory that never finishes loading: the gateway's ready timeout must fire."""
    time.sleep(600)
    raise AssertionError("unreachable")
