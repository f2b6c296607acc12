"""ColQwen3: visual late interaction over a Qwen3-VL backbone, in the three published layouts vLLM 0.33 serves.

No transformers class exists for it; each publisher ships its own code, so the
layout is read from the checkpoint and the architecture:

- ``ColQwen3`` as colpali-engine writes it (``colpali_engine.models.ColQwen3``: a
  ``Qwen3VLModel`` with ``custom_text_proj``, hidden → dim with a bias; tensors
  ``model.visual.*``, ``model.language_model.*``, ``model.custom_text_proj.*`` or
  the same without ``model.``), and as TomoroAI publishes it (a
  ``Qwen3VLForConditionalGeneration`` under ``vlm.``, the projection
  ``embedding_proj_layer``, its width in ``embed_dim``; ``vlm.lm_head`` is never
  read). Every token's last hidden state is projected and L2-normalised.
- ``OpsColQwen3Model`` (OpenSearch-AI): ``custom_text_proj`` is hidden → hidden;
  its first ``dims`` outputs (the config's) are kept, then normalised: the
  default size here, and a smaller ``dimensions`` per request cuts further.
- ``Qwen3VLNemotronEmbedModel`` (NVIDIA): no projection; the language model
  attends both ways (its published code turns ``is_causal`` off in every layer),
  and each token's last hidden state is normalised (``hidden`` wide).
- ``ColQwen3_5`` (colpali-engine's ColQwen3.5): the same head and prompts over
  transformers' ``Qwen3_5Model``, whose linear-attention layers carry a state
  along a row, so its batches run padded, one sequence a row.

The backbone is transformers' ``Qwen3VLModel`` over packed rows
(``workers.models.media.qwen_vl.QwenVLEncoder``; bidirectional with a block
mask for NVIDIA's). The gateway's plan is the late-interaction one
(``shared.inputs.media.colpali``) with each publisher's prompts: colpali-engine's
and TomoroAI's ``"<|im_start|>user\\n<|vision_start|>…<|vision_end|>Describe the
image.<|im_end|><|endoftext|>"`` and queries followed by ten ``<|endoftext|>``
(TomoroAI strips the query; its processor caps a page at 1,280 image tokens,
as its ``from_pretrained`` does); OpenSearch-AI's visual prompt with an
assistant turn and the query as sent; NVIDIA's chat template around ``"Query:
query: …"`` and around the image followed by ``"passage: "``
(``processor_config.json``'s prefixes win where present). A text and an image in
one input are refused, as for the other late-interaction models.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from poolgate.shared.inputs.media.qwen2_vl import QwenImageSettings
from poolgate.workers.load.checkpoint import Checkpoint
from poolgate.workers.load.hf_tokenizer import files_of, read_tokenizer
from poolgate.workers.load.weights import CheckpointError, weight_files
from poolgate.workers.models.hf_auto import load_problems
from poolgate.workers.models.media import MediaBuilt, MediaFamily, MediaSource
from poolgate.workers.models.media.loading import refuse_partial
from poolgate.workers.models.media.qwen_vl import PACKED_ATTENTION, QwenVLEncoder, _chat_template
from poolgate.workers.pooling.dispatch import DispatchPooler, Pooler
from poolgate.workers.pooling.head import EmbedHead

COLPALI_ENGINE, OPENSEARCH, NEMOTRON = "ColQwen3", "OpsColQwen3Model", "Qwen3VLNemotronEmbedModel"
QWEN3_5 = "ColQwen3_5"  # colpali-engine's ColQwen3.5: a Qwen3.5 backbone (linear-attention layers: padded, not packed)
PROJECTIONS = ("custom_text_proj", "embedding_proj_layer")  # colpali-engine / OpenSearch-AI, TomoroAI
WRAPPERS = ("base_model.model.", "vlm.model.", "vlm.", "model.")  # stripped, first match, before the backbone's names
UNREAD = ("lm_head.",)  # a generation head (TomoroAI's vlm.lm_head, NVIDIA's lm_head): never read by pooling
BACKBONE_KEYS = ("text_config", "vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
                 "vision_end_token_id", "tie_word_embeddings")
VISUAL = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image."
AUGMENTATION = "<|endoftext|>" * 10  # the query-augmentation token, ten times (colpali-engine, TomoroAI)
TOMORO_MAX_IMAGE_TOKENS = 1280  # TomoroAI's processor's from_pretrained default: max_pixels = 1280 * 32 * 32
END = "<|im_end|><|endoftext|>"  # the visual prompt's end (colpali-engine, TomoroAI's default suffix)
PROMPTS: dict[str, dict[str, Any]] = {  # publisher -> its processor's page prompt and query shaping
    "colpali-engine": {"page": VISUAL + END, "query_prefix": "", "query_suffix": AUGMENTATION, "strip_query": False},
    "tomoro": {"page": VISUAL + END, "query_prefix": "", "query_suffix": AUGMENTATION, "strip_query": True},
    "opensearch": {"page": VISUAL + "<|im_end|><|im_start|>assistant\n<|endoftext|>", "query_prefix": "",
                   "query_suffix": "", "strip_query": False},
}


def _short(name: str) -> str:
    """A checkpoint name without its wrapper prefix (``WRAPPERS``)."""
    for prefix in WRAPPERS:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _layout(weights: Checkpoint, architecture: str) -> tuple[str, str | None]:
    """(publisher, the projection's checkpoint prefix or None): read from the tensor names."""
    names = list(weights)
    projection = next((n.rsplit(".", 1)[0] for n in names if _short(n).split(".")[0] in PROJECTIONS), None)
    if architecture == NEMOTRON:
        return "nemotron", projection
    if architecture == OPENSEARCH:
        return "opensearch", projection
    return ("tomoro" if any(n.startswith("vlm.") for n in names) else "colpali-engine"), projection


def _projection(weights: Checkpoint, prefix: str) -> nn.Linear:
    weight = weights[f"{prefix}.weight"].float()
    bias = weights[f"{prefix}.bias"].float() if f"{prefix}.bias" in weights else None
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    linear.load_state_dict({"weight": weight, **({"bias": bias} if bias is not None else {})})
    return linear.eval()


def _backbone(source: MediaSource, weights: Checkpoint, projection: str | None) -> nn.Module:
    """transformers' ``Qwen3VLModel`` (``Qwen3_5Model`` for ColQwen3.5) from the folder's tensors (wrapper prefixes
    dropped), loaded whole or refused; the projection's and a generation head's tensors are the only others allowed."""
    import transformers

    names = ("Qwen3_5Config", "Qwen3_5Model") if source.architecture == QWEN3_5 else ("Qwen3VLConfig", "Qwen3VLModel")
    config_class, model_class = (getattr(transformers, n) for n in names)
    hf = source.hf_config.get("vlm_config") or source.hf_config
    config = config_class(**{k: hf[k] for k in BACKBONE_KEYS if k in hf})
    allow_pickle = bool(getattr(source.settings, "allow_pickle_weights", False))
    weight_files(source.path, allow_pickle=allow_pickle)
    mapping = {r"^base_model\.model\.": "", r"^vlm\.model\.": "", r"^vlm\.": "", r"^model\.": ""}
    model, info = model_class.from_pretrained(str(source.path), config=config, dtype=torch.float32,
                                               key_mapping=mapping, output_loading_info=True,
                                               use_safetensors=None if allow_pickle else True)
    if projection is not None:
        for suffix in (".weight", ".bias"):
            if projection + suffix in weights:
                weights[projection + suffix]  # read by the head: not a tensor the load dropped
    unread = [k for k in info.get("unexpected_keys") or () if _short(k).startswith(UNREAD)
              or _short(k).split(".")[0] in PROJECTIONS]
    info = {**info, "unexpected_keys": [k for k in info.get("unexpected_keys") or () if k not in unread]}
    refuse_partial(source, source.path, load_problems(info, weights), f"{source.architecture} over "
                   f"{model_class.__name__}")
    return model.eval()


def _processor_config(path: Path) -> dict[str, Any]:
    file = path / "processor_config.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def _images(path: Path, publisher: str) -> QwenImageSettings:
    config = path / "preprocessor_config.json"
    settings = QwenImageSettings.from_config(json.loads(config.read_text()) if config.is_file() else {})
    if publisher == "tomoro":  # its processor's from_pretrained caps a page's image tokens
        tile = settings.patch_size * settings.merge_size
        settings = replace(settings, max_pixels=TOMORO_MAX_IMAGE_TOKENS * tile * tile)
    return settings


def _nemotron_prompts(tokenizer: Any, path: Path) -> dict[str, Any]:
    """NVIDIA's processor's strings, from the folder's chat template: a query is the user turn ``"Query: " +
    query_prefix + " " + text`` with the generation prompt; a page is the user turn of the image then
    ``passage_prefix + " "``."""
    template = _chat_template(tokenizer, path)
    if template is None:
        raise CheckpointError(path, f"{NEMOTRON}: no chat template (its processor renders queries and pages with it)")
    extra = _processor_config(path)
    query_prefix, passage_prefix = extra.get("query_prefix", "query:"), extra.get("passage_prefix", "passage:")
    mark = "\x00poolgate-query\x00"

    def render(content: list[dict[str, Any]]) -> str:
        return tokenizer.apply_chat_template([{"role": "user", "content": content}], chat_template=template,
                                             tokenize=False, add_generation_prompt=True)

    query_text = f"{query_prefix} {mark}" if query_prefix else mark
    before, sep, after = render([{"type": "text", "text": f"Query: {query_text}"}]).partition(mark)
    page_text = f"{passage_prefix} " if passage_prefix else ""
    page = render([{"type": "image"}, {"type": "text", "text": page_text}])
    image_before, found, image_after = page.partition("<|image_pad|>")
    if not sep or not found:
        raise CheckpointError(path, f"{NEMOTRON}: its chat template does not render a query and an image as expected")
    return {"image_before": image_before, "image_after": image_after, "query_prefix": before, "query_suffix": after,
            "strip_query": False}


def build(source: MediaSource) -> MediaBuilt:
    hf = source.hf_config.get("vlm_config") or source.hf_config
    text = hf.get("text_config") or {}
    weights = Checkpoint.open(source.path, allow_pickle=bool(getattr(source.settings, "allow_pickle_weights", False)))
    publisher, projection = _layout(weights, source.architecture)
    if publisher != "nemotron" and projection is None:
        raise CheckpointError(source.path, f"{source.architecture}: no projection tensors ({' or '.join(PROJECTIONS)})")
    model = _backbone(source, weights, projection)
    head = None if projection is None else _projection(weights, projection)
    weights.close()
    hidden = int(text["hidden_size"])
    dims = head.out_features if head is not None else hidden
    cut = None
    if publisher == "opensearch":  # the projection is hidden → hidden; its first ``dims`` are the vector
        cut = int(source.hf_config.get("dims") or dims)
        if not 0 < cut <= dims:
            raise CheckpointError(source.path / "config.json", f"dims {cut} is not within the projection's {dims}")
        dims = cut
    tokenizer = read_tokenizer(source.path)
    image_token_id = int(hf.get("image_token_id") or 151655)
    images = _images(source.path, publisher)
    if publisher == "nemotron":
        prompts = _nemotron_prompts(tokenizer, source.path)
    else:
        prompts = dict(PROMPTS[publisher])
        extra = _processor_config(source.path)
        if publisher == "tomoro":  # its processor takes these as init arguments (processor_config.json)
            prompts["page"] = (extra.get("visual_prompt_prefix") or VISUAL) + (extra.get("visual_prompt_suffix") or END)
            prompts["query_prefix"] = extra.get("query_prefix") or ""
        before, found, after = prompts.pop("page").partition("<|image_pad|>")
        if not found:
            raise CheckpointError(source.path, f"{source.architecture}: its visual prompt holds no <|image_pad|>")
        prompts.update(image_before=before, image_after=after)
    settings = {"plan": "colqwen3", "processor": "qwen2_vl", "pixels": images.to_dict(), "image_token": "<|image_pad|>",
                "image_token_id": image_token_id, "image_tokens": None, "add_special_tokens": True,
                "publisher": publisher, **prompts}
    files = replace(files_of(tokenizer), media=settings)
    pad_id = int(text.get("pad_token_id") or hf.get("pad_token_id") or 0)
    encoder = QwenVLEncoder(model, image_token_id, pad_id, bidirectional=publisher == "nemotron",
                            packed=source.architecture != QWEN3_5)
    tokens = EmbedHead(None if head is None else head.to(source.device), True, cut, l2_cut=source.ops.l2_cut)
    pooler = DispatchPooler({"token_embed": Pooler("ALL", tokens)}, active="token_embed", ops=source.ops)
    max_len = int(getattr(source.settings, "max_model_len", None) or text.get("max_position_embeddings") or 32768)
    return MediaBuilt(model=encoder, pooler=pooler, files=files, modalities=("text", "image"), embedding_dim=dims,
                      max_model_len=max_len, extra={"publisher": publisher, "backbone": type(model).__name__,
                                                    "bidirectional": publisher == "nemotron",
                                                    "image_processor": settings["pixels"]})


HOW = {
    COLPALI_ENGINE: "transformers Qwen3VLModel (packed rows) + the checkpoint's custom_text_proj or "
                    "embedding_proj_layer (colpali-engine's or TomoroAI's layout)",
    OPENSEARCH: "transformers Qwen3VLModel (packed rows) + custom_text_proj (hidden -> hidden), its first `dims` kept",
    NEMOTRON: "transformers Qwen3VLModel attending both ways (packed rows under a block mask), no projection",
    QWEN3_5: "transformers Qwen3_5Model (padded, a sequence a row) + custom_text_proj",
}
ATTENTION = {
    COLPALI_ENGINE: PACKED_ATTENTION, OPENSEARCH: PACKED_ATTENTION,
    NEMOTRON: PACKED_ATTENTION.replace("within itself", "within itself, both ways (a block mask)"),
    QWEN3_5: "transformers' own, a sequence a row padded on the right (its linear-attention layers carry a state "
             "along a row)",
}
FAMILIES = {name: MediaFamily("colqwen3.5" if name == QWEN3_5 else "colqwen3", build,
                              f"{how}; a normalised vector per token", tasks=("token_embed",),
                              modalities=("text", "image"), attention=ATTENTION[name])
            for name, how in HOW.items()}
