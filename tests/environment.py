"""The caller's environment variables that would change a test's outcome, and the environment without them.

A shell's ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` makes huggingface_hub refuse every URL (a loopback
server's too), ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` size torch's thread pools, ``OTEL_*`` sends the
servers' spans somewhere, and ``POOLGATE_*`` gives them an API key, a worker token or another attention
kernel: none of them is the suite's to take from whoever runs it. Kept (``KEPT``): what CI sets on purpose
to run the suite as a smaller CPU. tests/conftest.py leaves them out of the whole run, before any test module
is imported; the helpers that start servers pass ``clean_env()`` as well, so they hold outside pytest too.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

LEFT_OUT = frozenset({"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS", "MKL_NUM_THREADS"})
LEFT_OUT_PREFIXES = ("POOLGATE_", "OTEL_")
KEPT = frozenset({"POOLGATE_CPU_CLASS", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS",
                  "POOLGATE_KERNEL_CACHE"})


def left_out(environ: Mapping[str, str]) -> list[str]:
    """The names in ``environ`` that the suite runs without (module doc)."""
    return sorted(k for k in environ if k not in KEPT and (k in LEFT_OUT or k.startswith(LEFT_OUT_PREFIXES)))


def clean_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``environ`` without the caller's settings (module doc), for a subprocess."""
    drop = set(left_out(environ))
    return {k: v for k, v in environ.items() if k not in drop}
