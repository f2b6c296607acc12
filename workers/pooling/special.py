"""Special models: architectures whose poolers are their own (SPLADE, BGE-M3, ColBERT, GritLM, Qwen2 reward models).

A checkpoint is served as one of these by naming the entry's architecture
(vLLM's names; ``--hf-overrides '{"architectures": [...]}'``). An entry says
which architecture's packed family runs its encoder, which tasks it serves (the first is
its default active task), how it pools (for ``inspect``) and the factory that builds its poolers from the
load's ``PoolerSources``. ``workers.models.ARCHITECTURES`` registers each
name with its family, ``workers.pooling.for_model.poolers_for`` calls the
factory, and ``poolgate inspect`` prints the tasks; nothing else names them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from poolgate.workers.pooling.bge_m3 import bge_m3_poolers
from poolgate.workers.pooling.colbert import colbert_poolers
from poolgate.workers.pooling.dispatch import DispatchPooler
from poolgate.workers.pooling.gritlm import gritlm_poolers
from poolgate.workers.pooling.reward import reward_poolers
from poolgate.workers.pooling.sources import PoolerSources
from poolgate.workers.pooling.splade import splade_poolers
from poolgate.workers.pooling.voyage import voyage_poolers


@dataclass(frozen=True)
class SpecialModel:
    """One special architecture: the architecture its encoder is, the tasks it serves, and its pooler factory."""

    encoder: str  # an ARCHITECTURES name: its packed family runs this model's encoder
    tasks: tuple[str, ...]
    poolers: Callable[[PoolerSources], DispatchPooler]
    pooling: str  # what ``poolgate inspect`` prints as its pooling


SPECIAL_MODELS: dict[str, SpecialModel] = {
    "BertSpladeSparseEmbeddingModel": SpecialModel(
        "BertForMaskedLM", ("embed",), splade_poolers,
        "SPLADE: max over tokens of log1p(relu(MLM logits)), CLS and SEP left out; not normalized"),
    "BgeM3EmbeddingModel": SpecialModel(
        "XLMRobertaModel", ("embed", "token_embed", "token_classify"), bge_m3_poolers,
        "BGE-M3: embed CLS, normalized; token_embed colbert_linear per token, normalized; "
        "token_classify relu(sparse_linear) per token"),
    "HF_ColBERT": SpecialModel(
        "BertModel", ("token_embed",), colbert_poolers,
        "ColBERT: every token's linear projection (config dim), normalized; scored with MaxSim"),
    "VoyageQwen3BidirectionalEmbedModel": SpecialModel(
        "Qwen3Model", ("embed", "token_embed"), voyage_poolers,
        "Voyage: embed MEAN (or --pooler-config's) of the bidirectional Qwen3 states, through linear, normalized; "
        "token_embed each token through linear, normalized"),
    "GritLM": SpecialModel(
        "LlamaModel", ("embed", "token_embed"), gritlm_poolers,
        "GritLM: embed fp32 MEAN of the bidirectional Llama states after the instruction (<|embed|> + newline), "
        "normalized; token_embed each token, normalized"),
    "Qwen2ForRewardModel": SpecialModel(
        "Qwen2Model", ("token_classify",), reward_poolers,
        "reward: token_classify ALL (or --pooler-config's) through score (linear, relu, linear) to 1 label, sigmoid"),
    "Qwen2ForProcessRewardModel": SpecialModel(
        "Qwen2Model", ("token_classify",), reward_poolers,
        "process reward: token_classify STEP (step_tag_id rows, returned_token_ids columns) through score "
        "(linear, relu, linear) to 2 labels, softmax"),
}
