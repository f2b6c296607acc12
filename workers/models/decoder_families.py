"""The packed decoders' registry entries: each family's ``Family`` and its Hugging Face architecture names.

Every decoder family runs ``workers.models.decoder.PackedDecoder`` with its
own traits (``workers.models.decoder_config.TRAITS``) and pools LAST unless
the model says otherwise. Heads: the plain ``*Model``, ``*ForSequenceClassification``
and ``*ForTokenClassification`` (their ``score`` layer is read by
``workers.models.score``), and ``*ForCausalLM`` under ``--convert embed`` /
``--convert classify`` (``workers.load.convert``; the LM head stays in the checkpoint
for ``classifier_from_token``). Checkpoints of the ``*For*`` classes keep the
body under ``model.``.
"""
from __future__ import annotations

from poolgate.workers.models.base import Family
from poolgate.workers.models.decoder import PackedDecoder
from poolgate.workers.models.decoder_config import DecoderConfig

HEADS = frozenset({"model", "sequence_classification", "token_classification", "causal_lm"})
NAMES: dict[str, tuple[str, ...]] = {  # family → the transformers classes it serves (all exist in 5.24)
    "llama": ("LlamaModel", "LlamaForCausalLM", "LlamaForSequenceClassification", "LlamaForTokenClassification",
              # nvidia llama-nemotron embed / rerank (model_type llama_bidirec, its own code): packed, bidirectional
              "LlamaBidirectionalModel", "LlamaBidirectionalForSequenceClassification"),
    "mistral": ("MistralModel", "MistralForCausalLM", "MistralForSequenceClassification",
                "MistralForTokenClassification"),
    "qwen2": ("Qwen2Model", "Qwen2ForCausalLM", "Qwen2ForSequenceClassification", "Qwen2ForTokenClassification"),
    "qwen3": ("Qwen3Model", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification", "Qwen3ForTokenClassification",
              # jina-embeddings-v5-text-small (model_type jina_embeddings_v5): its task LoRA merged at load
              "JinaEmbeddingsV5Model"),
    "gemma": ("GemmaModel", "GemmaForCausalLM", "GemmaForSequenceClassification", "GemmaForTokenClassification"),
    "gemma2": ("Gemma2Model", "Gemma2ForCausalLM", "Gemma2ForSequenceClassification",
               "Gemma2ForTokenClassification"),
    # text-only Gemma 3 (EmbeddingGemma is a Gemma3TextModel); not the vision-language Gemma3Model
    "gemma3": ("Gemma3TextModel", "Gemma3ForCausalLM", "Gemma3TextForSequenceClassification"),
}


# llama_bidirec's ``pooling`` (its config class defaults to avg) → poolgate's pooling method
BIDIREC_POOLING = {"avg": "MEAN", "cls": "CLS", "last": "LAST"}


def default_pooling(hf: dict) -> str:
    """LAST, except for nemotron's bidirectional Llama: its config's ``pooling`` (avg by default)."""
    if hf.get("model_type") != "llama_bidirec":
        return "LAST"
    pooling = hf.get("pooling", "avg")
    if pooling not in BIDIREC_POOLING:
        raise ValueError(f"config.json pooling {pooling!r} is not one poolgate runs for llama_bidirec "
                         f"(known: {', '.join(BIDIREC_POOLING)})")
    return BIDIREC_POOLING[pooling]


def _family(name: str) -> Family:
    return Family(name=name, config=DecoderConfig.from_hf, model=PackedDecoder, default_pooling="LAST",
                  heads=HEADS, prefixes=("model.",), causal=True, pooling_for=default_pooling)


DECODER_ARCHITECTURES: dict[str, Family] = {
    arch: family for name, archs in NAMES.items() for family in [_family(name)] for arch in archs}
