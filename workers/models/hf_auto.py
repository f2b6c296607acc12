"""Fallback for architectures without a packed implementation: transformers' AutoModel, padded.

A fallback model is loaded whole or refused, as a packed one is: a tensor that
transformers leaves random (missing, mis-shaped) or drops (unexpected, and no
head read it) stops start-up with the file and the names, unless the class
itself declares it optional; ``--allow-partial-weights`` serves it anyway and
logs what was dropped or left random.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from poolgate.workers.batch.packing import PackedBatch, padded_ids
from poolgate.workers.load.checkpoint import InMemory, Tensors, few
from poolgate.workers.load.st_config import ModelSpec
from poolgate.workers.load.weights import CheckpointError, weight_files, weights_source

log = logging.getLogger("poolgate.worker")
UNUSED_MODULES = ("pooler.",)  # the base model's own pooler: poolgate pools last_hidden_state


def check_supported(spec: ModelSpec, trust_remote_code: bool) -> None:
    """Refuse, naming config.json, an architecture that neither poolgate nor transformers implements,
    and a checkpoint's own code (``auto_map``) without ``--trust-remote-code``."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    kind = spec.hf_config.get("model_type")
    remote = (spec.hf_config.get("auto_map") or {}).get("AutoModel")
    if kind in MODEL_MAPPING_NAMES or (remote and trust_remote_code):
        return
    where = spec.path / "config.json"
    if remote:
        raise CheckpointError(where, f"{spec.architecture} (model_type {kind!r}) needs the checkpoint's own code "
                                     f"({remote}); pass --trust-remote-code to run it")
    raise CheckpointError(where, f"unknown architecture {spec.architecture} (model_type {kind!r}): poolgate has no "
                                 "packed implementation and transformers does not know it")


def load_problems(info: dict, heads_read: Tensors) -> list[str]:
    """What transformers' loading info says was not loaded whole, after its own allowances (the class's
    ``_keys_to_ignore_on_load_missing/unexpected``, tied weights, saved buffers): missing tensors (left
    random), unexpected ones no head read (dropped), mis-shaped ones (left random). A missing base-model
    pooler is allowed: poolgate pools the last hidden states, never the pooler's output."""
    missing = sorted(k for k in info.get("missing_keys") or () if not k.startswith(UNUSED_MODULES))
    unexpected = sorted(k for k in info.get("unexpected_keys") or () if not heads_read.was_read(k))
    shapes = sorted(f"{k}: checkpoint {tuple(a)}, config expects {tuple(b)}"
                    for k, a, b in info.get("mismatched_keys") or ())
    named = (("missing tensors (left random)", missing), ("unexpected tensors (dropped)", unexpected),
             ("shape mismatch (left random)", shapes))
    return [f"{what} {few(items)}" for what, items in named if items]


class HfAutoEncoder(nn.Module):
    """Pads the packed batch, runs AutoModel, and packs the last hidden states again."""

    needs_groups = False  # transformers' own attention: no group plan
    packed_rows = False  # it pads its own batches: no token-bucket rows (workers.engine.runner)

    def __init__(self, spec: ModelSpec, *, allow_pickle: bool, trust_remote_code: bool = False,
                 heads_read: Tensors | None = None, allow_partial: bool = False):
        """``heads_read``: the load's checkpoint (base prefix dropped) after the poolers read their heads from it:
        a tensor a head read is not one transformers failed to place (a classifier's, ColBERT's projection)."""
        super().__init__()
        from transformers import AutoModel

        check_supported(spec, trust_remote_code)
        if not spec.gguf_file:
            weight_files(spec.path, allow_pickle=allow_pickle)  # no pickle without the flag, named as for packed
        # a GGUF file: transformers dequantizes it (workers.load.gguf); else safetensors unless pickles are allowed
        source = {"gguf_file": spec.gguf_file} if spec.gguf_file else {"use_safetensors": None if allow_pickle else True}
        self.model, info = AutoModel.from_pretrained(str(spec.path), torch_dtype=torch.float32,
                                                     trust_remote_code=trust_remote_code, output_loading_info=True,
                                                     ignore_mismatched_sizes=True, **source)
        self.model.eval()
        where = spec.path / spec.gguf_file if spec.gguf_file else weights_source(spec.path)
        problems = load_problems(info, heads_read or InMemory({}, str(where)))
        if problems and not allow_partial:
            raise CheckpointError(where, "; ".join(problems) + f" (for {type(self.model).__name__}; "
                                  "--allow-partial-weights serves it anyway)")
        if problems:
            log.warning("%s: serving a partial load (--allow-partial-weights): %s", where, "; ".join(problems))
        self.pad_id = int(spec.hf_config.get("pad_token_id") or 0)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        ids, mask = padded_ids(batch, self.pad_id)  # (batch, width) each
        n, width = ids.shape
        device = ids.device
        kwargs = {}
        if batch.token_type_ids is not None:  # a cross-encoder's pairs: segment ids, padding as segment 0
            types = torch.zeros((n, width), dtype=torch.long, device=device)
            types[mask] = batch.token_type_ids
            kwargs["token_type_ids"] = types  # (batch, width)
        out = self.model(input_ids=ids, attention_mask=mask.long(), **kwargs).last_hidden_state  # (batch, width, hidden)
        return out[mask]  # (n_tokens, hidden), in packed order
