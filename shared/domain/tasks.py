"""The pooling tasks a model can serve (vLLM's names), what each accepts, and the names vLLM removed."""

from typing import Literal, get_args

PoolingTask = Literal[
    "embed",  # one vector per input
    "classify",  # one score/probability vector per input
    "token_embed",  # one vector per token (late interaction, ColBERT-style)
    "token_classify",  # one label distribution per token (NER-style)
    "embed&token_classify",
    "plugin",
]
POOLING_TASKS: tuple[PoolingTask, ...] = get_args(PoolingTask)

# The per-request pooling params each task accepts (vLLM's PoolingParams valid keys).
TASK_PARAMS: dict[str, tuple[str, ...]] = {
    "embed": ("dimensions", "use_activation"),
    "classify": ("use_activation",),
    "token_embed": ("dimensions", "use_activation"),
    "token_classify": ("use_activation",),
}

# Removed task names, and vLLM's message for each.
REMOVED_TASKS: dict[str, str] = {
    "score": "`score` task was removed; use `classify` instead.",
    "encode": "`encode` task was removed; use `token_embed` or `token_classify` instead.",
}

# How a task scores pairs (the score/rerank dialects use it).
SCORE_TYPES: dict[str, str] = {
    "embed": "bi-encoder",
    "classify": "cross-encoder",
    "token_embed": "late-interaction",
}

# vLLM's get_pooling_task: with no task configured, the first of these the model serves is its active task.
ACTIVE_TASK_ORDER: tuple[PoolingTask, ...] = (
    "embed&token_classify",
    "embed",
    "classify",
    "token_embed",
    "token_classify",
    "plugin",
)
