"""What every test runs under: the CPU class chosen, none of the caller's settings, and the shared fixtures."""
from __future__ import annotations

import os
import sys

import pytest

from poolgate.shared.config.cpu import apply_cpu_class
from tests.environment import left_out
from tests.fakes import make_tiny_checkpoint

# POOLGATE_CPU_CLASS=avx2 (or avx512, avx512_bf16) runs the suite as that smaller CPU: poolgate's detection and,
# through their own caps, oneDNN's and ATen's kernels (set here before any test runs a torch kernel; workers the
# tests spawn inherit them). .ci/run runs the CPU-dependent tests a second time so (docs/testing.md).
apply_cpu_class()


def pytest_configure(config):
    """Leave the caller's settings out of the whole run (``tests.environment``), before any test module is
    imported: libgomp reads ``OMP_NUM_THREADS`` when torch loads, huggingface_hub its offline switch when it
    is imported (``constants.HF_HUB_OFFLINE``, set right here if a plugin imported it first), and the module
    fixtures start their servers before any function fixture runs."""
    patch = pytest.MonkeyPatch()
    config.add_cleanup(patch.undo)
    for name in left_out(os.environ):
        patch.delenv(name)
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None and hub.HF_HUB_OFFLINE:
        patch.setattr(hub, "HF_HUB_OFFLINE", False)


@pytest.fixture(autouse=True)
def environment_restored():
    """No test's change to ``os.environ`` outlives it (a ``del`` of a variable CI set would, for every later
    test)."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)


@pytest.fixture
def tiny_bert(tmp_path):
    """(folder, transformers model) of a tiny random BERT."""
    model = make_tiny_checkpoint(tmp_path / "bert")
    return tmp_path / "bert", model
