"""Shared fixtures; the fakes themselves live in tests/fakes.py."""
from __future__ import annotations

import pytest

from poolgate.shared.cpu import apply_cpu_class
from tests.fakes import make_tiny_checkpoint

# POOLGATE_CPU_CLASS=avx2 (or avx512, avx512_bf16) runs the suite as that smaller CPU: poolgate's detection and,
# through their own caps, oneDNN's and ATen's kernels (set here before any test runs a torch kernel; workers the
# tests spawn inherit them). .ci/run runs the CPU-dependent tests a second time so (docs/testing.md).
apply_cpu_class()


@pytest.fixture
def tiny_bert(tmp_path):
    """(folder, transformers model) of a tiny random BERT."""
    model = make_tiny_checkpoint(tmp_path / "bert")
    return tmp_path / "bert", model
