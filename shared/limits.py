"""Checks of pooling params and input lengths against a model, with vLLM's messages."""
from __future__ import annotations

from poolgate.shared.errors import ContextLengthExceeded, InvalidRequest, NotSupported
from poolgate.shared.params import PoolingParams
from poolgate.shared.wire import ModelInfo


def check_params(info: ModelInfo, params: PoolingParams) -> None:
    """Raise a 4xx for params this model cannot honour (task, dimensions, truncation)."""
    if params.task not in info.tasks:
        raise NotSupported(
            f"Unsupported task: {params.task!r} Supported tasks: {tuple(info.tasks)}", param="task"
        )
    _check_dimensions(info, params.dimensions)
    k = params.truncate_prompt_tokens
    if k is not None:
        if k < -1 or k == 0:
            raise InvalidRequest(
                "truncate_prompt_tokens must be -1 or a positive integer.", param="truncate_prompt_tokens"
            )
        if k > info.max_model_len:
            raise InvalidRequest(
                "truncate_prompt_tokens value is greater than max_model_len. "
                "Please request a smaller truncation size.",
                param="truncate_prompt_tokens",
            )


def _check_dimensions(info: ModelInfo, dimensions: int | None) -> None:
    if dimensions is None:
        return
    name = info.served_model_name
    if not info.is_matryoshka:
        raise InvalidRequest(
            f"Model '{name}' does not support Matryoshka embeddings; "
            f"dimensions must be unset (received dimensions={dimensions}).",
            param="dimensions",
        )
    allowed = info.matryoshka_dimensions
    if allowed is not None:
        if dimensions not in allowed:
            raise InvalidRequest(
                f"Model '{name}' only supports Matryoshka dimensions {list(allowed)}, got {dimensions}.",
                param="dimensions",
            )
    elif not 1 <= dimensions <= info.embedding_dim:
        raise InvalidRequest(
            f"Model '{name}' only supports dimensions in range [1, {info.embedding_dim}], got {dimensions}.",
            param="dimensions",
        )


def truncation_length(info: ModelInfo, params: PoolingParams) -> int | None:
    """How many tokens to keep, or None when the caller asked for no truncation."""
    k = params.truncate_prompt_tokens
    if k is None:
        return None
    return info.max_model_len if k == -1 else k


def check_length(info: ModelInfo, n_tokens: int) -> None:
    """Reject an (untruncated) input that does not fit the model."""
    if n_tokens == 0:
        raise InvalidRequest("The decoder prompt cannot be empty", param="input")
    if n_tokens > info.max_model_len:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {info.max_model_len} tokens. "
            f"However, your prompt contains {n_tokens} input tokens, which exceeds this limit "
            "even without any output tokens. Please reduce the length of the input prompt.",
            param="input_tokens",
        )


def check_token_ids(info: ModelInfo, ids: list[int]) -> None:
    """Reject token ids the model's embedding table does not have (never a 500 in a batch)."""
    if info.vocab_size is not None and ids and max(ids) >= info.vocab_size:
        raise InvalidRequest(
            f"Token id {max(ids)} is out of vocabulary (the model has {info.vocab_size} tokens).", param="input"
        )
