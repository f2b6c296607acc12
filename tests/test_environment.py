"""The suite runs without the caller's settings (tests/environment.py) and keeps the CPU class CI chose."""
from __future__ import annotations

import os

from tests.environment import clean_env, left_out


def test_the_callers_settings_are_left_out_and_the_cpu_class_is_kept():
    caller = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "POOLGATE_API_KEY": "sk-shell", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "PATH": "/bin",
              "POOLGATE_CPU_CLASS": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
              "POOLGATE_KERNEL_CACHE": "/cache", "HF_HOME": "/hf"}
    assert clean_env(caller) == {"PATH": "/bin", "POOLGATE_CPU_CLASS": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                                 "ATEN_CPU_CAPABILITY": "avx2", "POOLGATE_KERNEL_CACHE": "/cache", "HF_HOME": "/hf"}


def test_this_run_has_none_of_them():
    """Whatever the shell running pytest set (conftest's ``pytest_configure``)."""
    from huggingface_hub import constants

    assert left_out(os.environ) == []
    assert not constants.HF_HUB_OFFLINE
