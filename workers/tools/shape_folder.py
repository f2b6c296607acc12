"""A servable random-weight model folder of a named shape (``bench_shapes.SHAPES``), for speed runs.

``write_shape`` saves the shape's random-weight checkpoint (``bench_arch.make_checkpoint``)
with the bundled MiniLM's BERT-uncased tokenizer beside it, so ``poolgate serve DIR``
and sentence-transformers (mean pooling over a plain transformers folder) both load
it. Weights do not change speed; every shape's vocabulary holds the tokenizer's
30,522 ids. ``max_model_len`` caps the folder's ``max_position_embeddings`` use
through the tokenizer's ``model_max_length``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from poolgate.shared.config.models import bundled_model_path
from poolgate.workers.tools.bench_arch import make_checkpoint, shape_config

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
MIN_VOCAB = 30522  # the bundled tokenizer's ids


def write_shape(folder: Path, family: str, shape: str, *, seed: int = 0, max_model_len: int = 512) -> str:
    """Write the shape's folder; returns its architecture. KeyError for an unknown shape, ValueError for a
    shape whose vocabulary cannot hold the tokenizer's ids."""
    vocab = shape_config(family, shape).get("vocab_size", MIN_VOCAB)
    if vocab < MIN_VOCAB:
        raise ValueError(f"{family}/{shape} has {vocab} token ids; the bundled tokenizer needs {MIN_VOCAB}")
    folder.mkdir(parents=True, exist_ok=True)
    architecture = make_checkpoint(folder, family, shape, seed)
    source = bundled_model_path()
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["model_max_length"] = max_model_len
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return architecture
