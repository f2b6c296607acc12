"""The Triton kernels' tests run in Triton's interpreter (on CPU tensors) unless the environment says otherwise."""
import importlib.util
import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
