"""A media family's transformers model from its folder, loaded whole or refused (as ``workers.models.hf_auto``).

Pickled weights only with ``--allow-pickle-weights``; what transformers left
random or dropped (``workers.models.hf_auto.load_problems``) stops the load,
naming the file and the tensors, unless ``--allow-partial-weights``, which
serves it and logs what was left out.
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from poolgate.workers.load.checkpoint import InMemory
from poolgate.workers.load.weights import CheckpointError, weight_files, weights_source
from poolgate.workers.models.hf_auto import load_problems
from poolgate.workers.models.media import MediaSource

log = logging.getLogger("poolgate.worker")


def load_whole(source: MediaSource, cls: Any = None) -> nn.Module:
    """transformers' ``cls`` (default: the class named by ``source.architecture``) from the folder in fp32, eval."""
    if cls is None:
        import transformers

        cls = getattr(transformers, source.architecture, None)
        if cls is None:
            raise CheckpointError(source.path / "config.json", f"transformers has no class {source.architecture}")
    settings = source.settings
    allow_pickle = bool(getattr(settings, "allow_pickle_weights", False))
    weight_files(source.path, allow_pickle=allow_pickle)  # no pickle without the flag, named as for text models
    model, info = cls.from_pretrained(str(source.path), dtype=torch.float32, output_loading_info=True,
                                      ignore_mismatched_sizes=True, use_safetensors=None if allow_pickle else True)
    where = weights_source(source.path)
    refuse_partial(source, where, load_problems(info, InMemory({}, str(where))), cls.__name__)
    return model.eval()


def refuse_partial(source: MediaSource, where: Any, problems: list[str], what: str) -> None:
    """A load with ``problems`` (``load_problems``) stops here, naming ``where`` and ``what`` was loaded, unless
    ``--allow-partial-weights``, which serves it and logs what was left out."""
    if problems and not getattr(source.settings, "allow_partial_weights", False):
        raise CheckpointError(where, "; ".join(problems) + f" (for {what}; --allow-partial-weights serves it anyway)")
    if problems:
        log.warning("%s: serving a partial load (--allow-partial-weights): %s", where, "; ".join(problems))
