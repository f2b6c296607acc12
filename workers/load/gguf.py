"""GGUF checkpoints (llama.cpp's single-file format) read through transformers' own GGUF loader.

``poolgate serve model.gguf`` (or a folder holding exactly one ``.gguf`` and no
``config.json``) takes its config, tokenizer and weights from the file, as
transformers does with ``from_pretrained(folder, gguf_file=name)``: the config
and tokenizer through that call, the weights through
``load_gguf_checkpoint``, which dequantizes every tensor (Q4_0, Q4_1, Q8_0, K-quants ...)
to fp32 and names it as the transformers model would (Llama's permuted Q/K
undone). The tensors then fill the packed family like any safetensors
checkpoint (``workers.models.build_model``), or transformers' AutoModel for
architectures without one. A GGUF file holds a causal LM: it serves with
``--convert embed`` (LAST pooling), and needs the ``gguf`` package
(``pip install 'poolgate[gguf]'``).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

log = logging.getLogger("poolgate.worker")
SUFFIX = ".gguf"


def find_gguf(path: Path) -> tuple[Path, str] | None:
    """(folder, file name) when ``path`` is a ``.gguf`` file or a folder with one and no config.json."""
    if path.is_file() and path.suffix == SUFFIX:
        return path.parent, path.name
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    files = sorted(p.name for p in path.glob(f"*{SUFFIX}"))
    if len(files) > 1:
        from poolgate.workers.load.weights import CheckpointError

        raise CheckpointError(path, f"holds several GGUF files ({', '.join(files)}); name the one to serve")
    return (path, files[0]) if files else None


def _require_gguf(source: Path) -> None:
    from poolgate.workers.load.weights import CheckpointError

    try:
        import gguf  # noqa: F401
    except ImportError:
        raise CheckpointError(source, "is a GGUF checkpoint and needs the gguf package: "
                                      "pip install 'poolgate[gguf]'") from None


def read_config(folder: Path, name: str) -> dict:
    """The Hugging Face config transformers derives from the file's metadata, with its causal-LM class
    as ``architectures`` (the file does not name one)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from poolgate.workers.load.weights import CheckpointError

    _require_gguf(folder / name)
    try:
        config = AutoConfig.from_pretrained(str(folder), gguf_file=name).to_dict()
    except ValueError as e:  # an architecture transformers' GGUF loader does not know
        raise CheckpointError(folder / name, str(e)) from None
    if not config.get("architectures"):
        config["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config["model_type"]]]
    return config


def load_state(folder: Path, name: str, hf_config: dict) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantized to fp32, under transformers' names (``model.layers.0...``);
    ``hf_config`` is ``read_config``'s (reading the file's metadata again takes seconds)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    source = folder / name
    _require_gguf(source)
    log.info("loading GGUF weights %s (dequantizing to float32)", source)
    config = AutoConfig.for_model(**hf_config)
    with torch.device("meta"):  # only its parameter names, to map the GGUF names onto
        names = AutoModelForCausalLM.from_config(config)
    return dict(load_gguf_checkpoint(str(source), return_tensors=True, model_to_load=names)["tensors"])
