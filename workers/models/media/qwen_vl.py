"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL embedders (GME, Qwen3-VL-Embedding, jina-embeddings-v4 style) and the
jina-reranker-m0 reranker (``JinaVLForRanking``), on transformers' own model.

The batch's sequences, text and image tokens alike, run packed: several
sequences to a row, none padded to another's length, each attending only
within itself (``workers.models.media.qwen_vl_rows``: four-row position ids,
M-RoPE's as transformers computes them). Every image of the batch goes to
the vision tower at once (its ``pixel_values`` rows concatenated, one
``image_grid_thw`` row each: the tower's own variable-length plan over the
batch's images), and transformers scatters the image features onto the
expanded pad tokens. The last hidden state of every real token comes back in
the batch's packed order.

Embedders pool LAST (GME, Qwen3-VL-Embedding: the final token) or, with
``--pooler-config '{"seq_pooling_type": "MEAN"}'``, the mean over the tokens,
normalized. jina-embeddings-v4's single vector (its config's
``single_vector_pool_strategy: "mean"``, or that key in ``--hf-overrides`` over a
merged Qwen2.5-VL checkpoint) is a MEAN over only the image's tokens, from
``<|vision_start|>`` through ``<|vision_end|>``, for an input holding an image
(over every token otherwise), as its published ``get_single_vector_embeddings``
pools; its multi-vector output (``token_embed``) goes through
``multi_vector_projector`` (hidden → 128) where the checkpoint has one.
``JinaVLForRanking`` adds jina-reranker-m0's head on the LAST token: ``score.0``
(hidden→hidden) → ReLU → ``score.2`` (hidden→1), minus 2.65, sigmoid; its
prompt is written by the plan (``shared.inputs.media.qwen_vl``).

``Qwen3VLForSequenceClassification`` (Qwen3-VL-Reranker, served as vLLM documents it: ``--hf-overrides
'{"architectures": ["Qwen3VLForSequenceClassification"], "classifier_from_token": ["no", "yes"],
"is_original_qwen3_reranker": true}'``) scores the LAST token with the LM head's ``yes`` row minus its
``no`` row, sigmoid; its prompt (vLLM's ``qwen3_vl_reranker.jinja``) is written by the plan.

A checkpoint saved as ``*ForConditionalGeneration`` carries a language-model
head (``lm_head``) that pooling never reads: it is left unloaded and allowed.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from poolgate.shared.inputs.media.qwen2_vl import QwenImageSettings
from poolgate.shared.inputs.media.qwen_vl import JINA_RERANK, PLAN, QWEN3_VL_RERANK
from poolgate.workers.batch.packing import padded_ids
from poolgate.workers.load.checkpoint import Checkpoint
from poolgate.workers.load.hf_tokenizer import files_of, read_tokenizer
from poolgate.workers.load.weights import CheckpointError
from poolgate.workers.models.hf_auto import load_problems
from poolgate.workers.models.media import MediaBuilt, MediaFamily, MediaSource
from poolgate.workers.models.media.loading import refuse_partial
from poolgate.workers.models.media.qwen_vl_rows import (
    block_mask,
    grids_of,
    image_order,
    lay_out,
    packed_inputs,
    rope_positions,
)
from poolgate.workers.pooling.classify import ClassifyHead
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead
from poolgate.workers.pooling.rows import per_sequence_counts

JINA_RANK, QWEN3_RERANK = "JinaVLForRanking", "Qwen3VLForSequenceClassification"
# architecture -> transformers' base model class (the backbone without a language-model head)
BACKBONES = {
    "Qwen2VLForConditionalGeneration": "Qwen2VLModel",
    "Qwen2VLModel": "Qwen2VLModel",
    "Qwen2_5_VLForConditionalGeneration": "Qwen2_5_VLModel",
    "Qwen2_5_VLModel": "Qwen2_5_VLModel",
    "Qwen3VLForConditionalGeneration": "Qwen3VLModel",
    "Qwen3VLModel": "Qwen3VLModel",
    JINA_RANK: "Qwen2VLModel",
    QWEN3_RERANK: "Qwen3VLModel",  # Qwen3-VL-Reranker, as vLLM documents it (module doc)
}
RERANKERS = frozenset({JINA_RANK, QWEN3_RERANK})
UNREAD = ("lm_head.",)  # a generation checkpoint's head: pooling never reads it
JINA_LOGIT_BIAS = 2.65  # jina-reranker-m0 subtracts it from the head's logit before the sigmoid
JINA_SCORE_TOKEN = 100  # the token its prompt ends with, whose last hidden state is scored
JINA_HEAD = ("score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias")
PROJECTOR = "multi_vector_projector"  # jina-embeddings-v4's token projection (hidden -> 128)


PACKED_ATTENTION = ("transformers' own over packed rows: several sequences a row, none padded to another's "
                    "length, each attending only within itself")


class QwenVLEncoder(nn.Module):
    """Transformers' Qwen-VL backbone over a packed batch with its images (module doc)."""

    takes_media = True
    needs_groups = False
    packed_rows = False

    def __init__(self, model: nn.Module, image_token_id: int, pad_id: int, *, bidirectional: bool = False,
                 packed: bool = True):
        super().__init__()
        self.model, self.image_token_id, self.pad_id = model, image_token_id, pad_id
        self.bidirectional = bidirectional  # every token of a sequence sees all of it (``qwen_vl_rows.block_mask``)
        self.packed = packed  # False: a sequence a row, padded on the right (recurrent layers would carry state on)

    def _padded(self, ids: torch.Tensor, mask: torch.Tensor, items: list) -> torch.Tensor:
        """One sequence a row, padded on the right under its attention mask (transformers' positions from it)."""
        extra: dict[str, torch.Tensor] = {"mm_token_type_ids": (ids == self.image_token_id).int()}
        if items:
            dtype = next(self.model.parameters()).dtype
            pixels = np.concatenate([m.arrays["pixel_values"] for m in items])
            extra["pixel_values"] = torch.from_numpy(pixels).to(device=ids.device, dtype=dtype)
            extra["image_grid_thw"] = torch.from_numpy(grids_of(items)).to(device=ids.device, dtype=torch.long)
        out = self.model(input_ids=ids, attention_mask=mask.long(), use_cache=False, **extra).last_hidden_state
        return out[mask]  # (n_tokens, hidden), in packed order

    def forward(self, batch: Any) -> torch.Tensor:
        ids, mask = padded_ids(batch, self.pad_id)  # (batch, width) each: where transformers' positions are read
        device = ids.device
        items = [m for seq in (batch.media or []) if seq for m in seq]  # in sequence order
        if not self.packed:
            return self._padded(ids, mask, items)
        grids = grids_of(items)
        grid_block = None if grids is None else torch.from_numpy(grids).to(device=device, dtype=torch.long)
        positions = rope_positions(self.model, ids, mask, grid_block, self.image_token_id)
        rows = lay_out(batch.lengths)  # several sequences a row, none padded to another's length
        packed, position_ids, order = packed_inputs(ids, mask, batch.lengths, positions, self.pad_id, rows)
        extra: dict[str, torch.Tensor] = {}
        if items:  # every image of the batch through the vision tower in one call, in the rows' token order
            ordered = image_order(batch.media, order)
            dtype = next(self.model.parameters()).dtype
            pixels = np.concatenate([m.arrays["pixel_values"] for m in ordered])
            extra = {
                "pixel_values": torch.from_numpy(pixels).to(device=device, dtype=dtype),
                "image_grid_thw": torch.from_numpy(grids_of(ordered)).to(device=device, dtype=torch.long),
                "mm_token_type_ids": (packed == self.image_token_id).int(),
            }
        if self.bidirectional:  # a 4-D mask is used as given: each sequence attends within itself, both ways
            dtype = next(self.model.parameters()).dtype
            extra["attention_mask"] = block_mask(rows, batch.lengths, dtype).to(device)
        out = self.model(input_ids=packed, position_ids=position_ids, use_cache=False, **extra).last_hidden_state
        return out.reshape(-1, out.shape[-1])[rows.token_index(batch.lengths).to(device)]  # (n_tokens, hidden)


class JinaScore(nn.Module):
    """jina-reranker-m0's head: dense → ReLU → out_proj, minus its logit bias (module doc)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.relu(self.dense(x))) - JINA_LOGIT_BIAS


def _backbone(source: MediaSource) -> tuple[nn.Module, Checkpoint]:
    """transformers' base model loaded whole from the folder (a generation head allowed unread), and the
    checkpoint handle (for a head of ours)."""
    import transformers

    cls = getattr(transformers, BACKBONES[source.architecture])
    model, info = cls.from_pretrained(
        str(source.path), torch_dtype=torch.float32, output_loading_info=True, use_safetensors=True
    )
    weights = Checkpoint.open(source.path)
    for name in JINA_HEAD if source.architecture == JINA_RANK else ():
        if name not in weights:
            raise CheckpointError(source.path, f"{source.architecture}: the head tensor {name} is missing")
        weights[name]  # read: not an unexpected tensor
    for name in (f"{PROJECTOR}.weight", f"{PROJECTOR}.bias"):
        if name in weights and source.architecture not in RERANKERS:
            weights[name]
    info = {**info, "unexpected_keys": [k for k in info.get("unexpected_keys") or () if not k.startswith(UNREAD)]}
    refuse_partial(source, source.path, load_problems(info, weights), cls.__name__)
    return model.eval(), weights


def _jina_head(weights: Checkpoint, hidden: int) -> JinaScore:
    head = JinaScore(hidden)
    state = {"dense.weight": weights["score.0.weight"], "dense.bias": weights["score.0.bias"],
             "out_proj.weight": weights["score.2.weight"], "out_proj.bias": weights["score.2.bias"]}
    head.load_state_dict({k: v.float() for k, v in state.items()})
    return head.eval()


def _token_head(source: MediaSource, weights: Checkpoint, tokenizer: Any) -> nn.Module:
    """Qwen3-VL-Reranker's score: the LM head's rows for ``classifier_from_token`` (``["no", "yes"]``: one row,
    yes − no), from ``lm_head.weight`` or, for a tied checkpoint, the input embeddings."""
    from poolgate.workers.models.score import _from_tokens

    tokens = source.hf_config.get("classifier_from_token")
    if not tokens or len(tokens) > 2:
        raise CheckpointError(source.path, f"{QWEN3_RERANK} scores LM-head rows: it needs --hf-overrides "
                              '\'{"classifier_from_token": ["no", "yes"]}\' (one or two tokens)')
    tied = ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight")
    name = next((n for n in ("lm_head.weight", *tied) if n in weights), None)
    if name is None:
        raise CheckpointError(source.path, f"{QWEN3_RERANK}: the checkpoint has no LM head (lm_head.weight) to score")
    return _from_tokens({"lm_head.weight": weights[name]}, tokenizer, list(tokens)).eval()


def _projector(weights: Checkpoint) -> nn.Linear | None:
    """jina-embeddings-v4's multi-vector projector, where the checkpoint has one."""
    if f"{PROJECTOR}.weight" not in weights:
        return None
    weight = weights[f"{PROJECTOR}.weight"].float()
    bias = weights[f"{PROJECTOR}.bias"].float() if f"{PROJECTOR}.bias" in weights else None
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    linear.load_state_dict({"weight": weight, **({"bias": bias} if bias is not None else {})})
    return linear.eval()


def vision_spans(start_id: int, end_id: int):
    """A MEAN row selector (``workers.pooling.rows``): in a sequence holding an image, the rows from each
    ``start_id`` through its ``end_id``; every row of a sequence without one."""

    def select(ids: np.ndarray, lengths: list[int]) -> tuple[np.ndarray, list[int]]:
        keep = np.ones(ids.shape[0], dtype=bool)
        start = 0
        for n in lengths:
            seq = ids[start : start + n]
            opens, closes = np.flatnonzero(seq == start_id), np.flatnonzero(seq == end_id)
            if opens.size and opens.size == closes.size:  # +1 at each start, -1 after each end: inside > 0
                mark = np.zeros(n + 1, dtype=np.int64)
                np.add.at(mark, opens, 1)
                np.add.at(mark, closes + 1, -1)
                keep[start : start + n] = np.cumsum(mark[:n]) > 0
            start += n
        return np.flatnonzero(keep), per_sequence_counts(keep, lengths)

    return select


def _image_settings(path: Path) -> QwenImageSettings:
    config = path / "preprocessor_config.json"
    return QwenImageSettings.from_config(json.loads(config.read_text()) if config.is_file() else {})


def _chat_template(tokenizer: Any, path: Path) -> str | None:
    """The tokenizer's chat template, else the processor's (``chat_template.json``/``.jinja`` beside it)."""
    if tokenizer.chat_template:
        return tokenizer.get_chat_template()
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    if (path / "chat_template.json").is_file():
        return json.loads((path / "chat_template.json").read_text()).get("chat_template")
    return None


def build(source: MediaSource) -> MediaBuilt:
    hf = source.hf_config
    text = hf.get("text_config") or hf
    hidden = int(text["hidden_size"])
    image_token_id = int(hf.get("image_token_id") or text.get("image_token_id") or 151655)
    model, weights = _backbone(source)
    tokenizer = read_tokenizer(source.path)
    placeholder = "".join(tokenizer.convert_ids_to_tokens(
        [int(hf.get("vision_start_token_id", 151652)), image_token_id, int(hf.get("vision_end_token_id", 151653))]))
    rerank = source.architecture in RERANKERS
    prompt = QWEN3_VL_RERANK if source.architecture == QWEN3_RERANK else JINA_RERANK if rerank else "embed"
    media = {"plan": PLAN, "image": _image_settings(source.path).to_dict(), "image_token_id": image_token_id,
             "placeholder": placeholder, "prompt": prompt}
    if prompt == JINA_RERANK:
        media["score_token_id"] = JINA_SCORE_TOKEN
    files = replace(files_of(tokenizer), chat_template=_chat_template(tokenizer, source.path), media=media)
    pad_id = int(text.get("pad_token_id") or hf.get("pad_token_id") or 0)
    encoder = QwenVLEncoder(model, image_token_id, pad_id)
    pooler_config = source.settings.pooler_config
    ops = source.ops
    if rerank:
        score = _token_head(source, weights, tokenizer) if prompt == QWEN3_VL_RERANK else _jina_head(weights, hidden)
        head = ClassifyHead(score.to(source.device), nn.Sigmoid(), use_activation=pooler_config.use_activation)
        pooler = DispatchPooler({"classify": Pooler("LAST", head)}, out_dim=1, ops=ops)
    else:
        jina = hf.get("single_vector_pool_strategy") == "mean" and not pooler_config.sequence_pooling
        method = "MEAN" if jina else pooler_config.sequence_pooling or "LAST"
        rows = vision_spans(int(hf.get("vision_start_token_id", 151652)), int(hf.get("vision_end_token_id", 151653)))
        embed = EmbedHead(None, True, pooler_config.dimensions, l2_cut=ops.l2_cut)
        projector = _projector(weights)
        tokens = EmbedHead(None if projector is None else projector.to(source.device), True, l2_cut=ops.l2_cut)
        pooler = DispatchPooler(
            {"embed": Pooler(method, embed, rows=rows) if jina else Pooler(method, embed),
             "token_embed": Pooler(pooler_config.token_pooling or "ALL", tokens)},
            active=pooler_config.task, ops=ops)
    weights.close()
    max_len = int(getattr(source.settings, "max_model_len", None) or text.get("max_position_embeddings") or 32768)
    return MediaBuilt(model=encoder, pooler=pooler, files=files, modalities=("text", "image"),
                      embedding_dim=1 if rerank else hidden, max_model_len=max_len,
                      extra={"image_processor": media["image"], "backbone": BACKBONES[source.architecture]})


def family(name: str) -> MediaFamily:
    rerank = name in RERANKERS
    what = ("sigmoid of the LM head's yes − no on the LAST token" if name == QWEN3_RERANK
            else "jina-reranker-m0 head on the LAST token" if rerank else "LAST/MEAN pooled")
    how = f"transformers {BACKBONES[name]} (packed rows), images through its vision tower; {what}"
    return MediaFamily(name, build, how,
                       tasks=("classify",) if rerank else ("embed", "token_embed"), modalities=("text", "image"),
                       attention=PACKED_ATTENTION)


FAMILIES = {name: family(name) for name in BACKBONES}  # what workers.models.media.families registers
