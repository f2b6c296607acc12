"""Shared fixtures; the fakes themselves live in tests/fakes.py."""
from __future__ import annotations

import pytest

from tests.fakes import make_tiny_checkpoint


@pytest.fixture
def tiny_bert(tmp_path):
    """(folder, transformers model) of a tiny random BERT."""
    model = make_tiny_checkpoint(tmp_path / "bert")
    return tmp_path / "bert", model
