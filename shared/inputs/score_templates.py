"""Score templates: how a generative reranker reads a (query, document) pair as one prompt.

A BERT-style cross-encoder reads a pair through its tokenizer's pair template;
an LLM reranker needs the prompt it was trained on. ``SCORE_TEMPLATES`` maps a
name to a function ``(query, document, instruction) -> prompt``; the model's
config picks one (``template_for``): ``is_original_qwen3_reranker`` (the
``--hf-overrides`` vLLM documents for Qwen3-Reranker) selects ``qwen3_reranker``,
and ``score_template`` (poolgate's own config key, e.g. in ``--hf-overrides``)
names any template here; nemotron's reranker (``ARCHITECTURE_TEMPLATES``) is always
read through its own. The prompt is then tokenized whole, with no token
type ids. Qwen3-Reranker's prompt is the one vLLM ships as
``qwen3_reranker.jinja``: its system turn, the instruction, query and document
in the user turn, and an opened assistant turn with an empty think block; its
score head (``classifier_from_token: ["no", "yes"]``) then gives P(yes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

QWEN3_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. "
    'Note that the answer can only be "yes" or "no".'
)
QWEN3_DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def qwen3_reranker(query: str, document: str, instruction: str | None) -> str:
    return (
        f"<|im_start|>system\n{QWEN3_SYSTEM}<|im_end|>\n<|im_start|>user\n"
        f"<Instruct>: {instruction or QWEN3_DEFAULT_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


QWEN3_VL_INSTRUCTION = "Given a search query, retrieve relevant candidates that answer the query."


def qwen3_vl_rerank(query: str, document: str, instruction: str | None) -> str:
    """Qwen3-VL-Reranker's prompt (vLLM's ``qwen3_vl_reranker.jinja``): Qwen3-Reranker's system turn, the instruction,
    query and document run together in the user turn, an opened assistant turn; its image pairs are laid out by the
    media plan (``shared.inputs.media.qwen_vl``)."""
    return (
        f"<|im_start|>system\n{QWEN3_SYSTEM}<|im_end|>\n<|im_start|>user\n"
        f"<Instruct>: {instruction or QWEN3_VL_INSTRUCTION}<Query>:{query}\n<Document>:{document}<|im_end|>\n"
        "<|im_start|>assistant\n\n"
    )


def bge_reranker_gemma(query: str, document: str, instruction: str | None) -> str:
    """bge-reranker-v2-gemma's prompt (vLLM's ``bge-reranker-v2-gemma.jinja``); served with
    ``classifier_from_token: ["Yes"]`` its score is sigmoid(logit_Yes)."""
    return (
        f"A: {query}\nB: {document}\nGiven a query A and a passage B, determine whether the passage "
        "contains an answer to the query by providing a prediction of either 'Yes' or 'No'."
    )


def nemotron_rerank(query: str, document: str, instruction: str | None) -> str:
    """llama-nemotron-rerank's prompt (vLLM's ``nemotron-rerank.jinja``): the question, a blank line, the passage;
    its ``LlamaBidirectionalForSequenceClassification`` head scores the pooled prompt."""
    return f"question:{query} \n \n passage:{document}"


MXBAI_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
MXBAI_TASK = (
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, carefully analyze the semantic relationship between them, then provide your "
    "binary relevance judgment (0 for not relevant, 1 for relevant)."
)


def mxbai_rerank_v2(query: str, document: str, instruction: str | None) -> str:
    """mxbai-rerank-v2's prompt (vLLM's ``mxbai_rerank_v2.jinja``): Qwen's system turn, query and document and the
    relevance task in the user turn, an opened assistant turn (served with ``classifier_from_token: ["0", "1"]``)."""
    return (
        f"<|im_start|>system\n{MXBAI_SYSTEM}<|im_end|>\n<|im_start|>user\nquery: {query}\ndocument: {document}\n"
        f"{MXBAI_TASK}\nRelevance:<|im_end|>\n<|im_start|>assistant\n"
    )


SCORE_TEMPLATES: dict[str, Callable[[str, str, str | None], str]] = {
    "qwen3_reranker": qwen3_reranker,
    "bge_reranker_gemma": bge_reranker_gemma,
    "nemotron_rerank": nemotron_rerank,
    "mxbai_rerank_v2": mxbai_rerank_v2,
}
# architectures that are always read through one template (their checkpoints name no other use)
ARCHITECTURE_TEMPLATES = {"LlamaBidirectionalForSequenceClassification": "nemotron_rerank"}


def template_for(hf_config: dict[str, Any]) -> str | None:
    """The score template the model's config asks for, or None (the tokenizer's pair template)."""
    name = hf_config.get("score_template")
    if name is None and hf_config.get("is_original_qwen3_reranker"):
        name = "qwen3_reranker"
    if name is None:
        name = ARCHITECTURE_TEMPLATES.get((hf_config.get("architectures") or [""])[0])
    if name is not None and name not in SCORE_TEMPLATES:
        raise ValueError(f"unknown score_template {name!r}; known: {', '.join(SCORE_TEMPLATES)}")
    return name
