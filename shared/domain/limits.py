"""Checks of a call against a model (task, params, inputs, lengths), with vLLM's messages.

The gateway's serving path runs ``check_params`` and ``check_inputs`` once per
request before it tokenizes (``check_call``: the same functions); a worker
runs ``check_token_call`` at its own boundary, since any client may reach it.
Lengths and ``truncate_prompt_tokens`` are checked against the input cap:
``max_model_len``, or for embed inputs with chunked processing ``max_embed_len``
(None: no cap; ``workers.engine.chunking`` then splits what is over ``max_model_len``).
A multi-output call (``PoolingParams.outputs``) runs each input once, whole, through
every output's head, so its cap is ``max_model_len`` (``cap_task``); its further
outputs are checked as calls of their own and must tokenize as the call does.
"""

from __future__ import annotations

from collections.abc import Sequence

from poolgate.shared.domain.errors import ContextLengthExceeded, InvalidRequest
from poolgate.shared.domain.late_chunks import TOKEN_TASK, LateChunkText, check_late
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.sparse import sparse_head
from poolgate.shared.domain.tasks import TASK_PARAMS
from poolgate.shared.wire.media import MediaInput
from poolgate.shared.wire.messages import CappedText, ChatInput, Input, ModelInfo, PoolingCall, TextPair, WindowedText
from poolgate.shared.wire.token_call import TokenCall

PAIR_TASKS = ("classify",)  # the tasks that read a TextPair as one sequence (a cross-encoder)
CHUNKED_TASKS = ("embed",)  # the tasks chunked processing splits (each folds back by workers.engine.chunking.FOLDS)


def check_call(info: ModelInfo, call: PoolingCall) -> None:
    """Everything about ``call`` that can be checked before tokenizing."""
    check_task(info, call.params)
    check_params(info, call.params)
    check_inputs(info, call.inputs, call.params.task)
    if call.params.outputs:
        _check_output_inputs(call.params, call.inputs)


def check_task(info: ModelInfo, params: PoolingParams) -> None:
    if params.task not in info.tasks:
        raise InvalidRequest(unsupported_task(info, params.task), param="task")


def unsupported_task(info: ModelInfo, task: str | None) -> str:
    """vLLM's message for a task the model does not serve."""
    return f"Unsupported task: {task!r} Supported tasks: {tuple(info.tasks)}"


def check_params(info: ModelInfo, params: PoolingParams) -> None:
    """Raise a 4xx for params this model cannot honour (params of the task, dimensions, truncation)."""
    _check_task_params(params)
    _check_dimensions(info, params.dimensions)
    _check_sparse(info, params)
    _check_adapter(info, params.adapter)
    if params.outputs:
        _check_outputs(info, params)
    k = params.truncate_prompt_tokens
    if k is not None:
        if k < -1 or k == 0:
            raise InvalidRequest(
                "truncate_prompt_tokens must be -1 or a positive integer.", param="truncate_prompt_tokens"
            )
        cap = input_cap(info, cap_task(params))
        if cap is not None and k > cap:
            raise InvalidRequest(
                f"truncate_prompt_tokens value is greater than {_cap_name(info, cap_task(params))}. "
                "Please request a smaller truncation size.",
                param="truncate_prompt_tokens",
            )


TOKENIZING = ("truncate_prompt_tokens", "add_special_tokens", "truncation_side")  # what the outputs share


def _check_outputs(info: ModelInfo, params: PoolingParams) -> None:
    """A multi-output call's further outputs: each a call of its own to this model, tokenized as the call is."""
    for out in params.outputs:
        if out.outputs:
            raise InvalidRequest("a further output cannot ask for outputs of its own", param="outputs")
        differ = [name for name in TOKENIZING if getattr(out, name) != getattr(params, name)]
        if differ:
            raise InvalidRequest(
                f"every output of one call reads the same tokens: {differ[0]} differs", param=differ[0]
            )
        if out.adapter != params.adapter:
            raise InvalidRequest("every output of one call runs the same forward: task differs", param="task")
        check_task(info, out)
        check_params(info, out)


def _check_adapter(info: ModelInfo, adapter: str | None) -> None:
    """The task adapter a call names (Jina's ``task``): one of the model's ``adapters``."""
    if adapter is None:
        return
    if not info.adapters:
        raise InvalidRequest(f"task {adapter!r}: model {info.served_model_name!r} has no task adapters", param="task")
    if adapter not in info.adapters:
        raise InvalidRequest(
            f"task {adapter!r} is not one of model {info.served_model_name!r}'s tasks: {', '.join(info.adapters)}",
            param="task",
        )


def _check_output_inputs(params: PoolingParams, inputs: list[Input]) -> None:
    """A multi-output call's inputs: plain inputs, pairs only where every output reads pairs."""
    for x in inputs:
        if isinstance(x, (WindowedText, LateChunkText)):
            raise InvalidRequest("windowed and late-chunked inputs take one output per call", param="outputs")
        if isinstance(x, TextPair):
            for out in params.outputs:
                _check_pair(x, out.task)


def cap_task(params: PoolingParams) -> str | None:
    """The task whose input cap applies: the call's own, or none (``max_model_len``, no chunking) for a
    multi-output call, whose every output reads each input whole in one forward."""
    return None if params.outputs else params.task


def _check_sparse(info: ModelInfo, params: PoolingParams) -> None:
    """Sparse output needs a sparse head, read through its own task (``shared.domain.sparse``)."""
    if params.return_tokens and not params.sparse:
        raise InvalidRequest("return_tokens applies to sparse embeddings", param="return_tokens")
    if params.sparse:
        head = sparse_head(info)
        if params.task != head.task:
            raise InvalidRequest(
                f"{info.architecture} gives sparse embeddings through task '{head.task}', not '{params.task}'.",
                param="task",
            )
        if params.dimensions is not None:
            raise InvalidRequest("dimensions does not apply to sparse embeddings", param="dimensions")


def _check_task_params(params: PoolingParams) -> None:
    """vLLM's rule: a task takes only its own pooling params."""
    valid = TASK_PARAMS.get(params.task, ())
    sent = [
        name for name in ("dimensions", "use_activation") if getattr(params, name) is not None and name not in valid
    ]
    if sent:
        raise InvalidRequest(
            f"Task '{params.task}' only supports {list(valid)} parameters, does not support {sent} parameters",
            param=sent[0],
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


def chunks_inputs(info: ModelInfo, task: str | None) -> bool:
    """Whether inputs of ``task`` over ``max_model_len`` run in chunks (vLLM: embed, with chunked processing)."""
    return info.chunked_processing and task in CHUNKED_TASKS


def input_cap(info: ModelInfo, task: str | None) -> int | None:
    """The most tokens one input of ``task`` may have: ``max_model_len``, or with chunked
    processing ``max_embed_len`` (None: no cap)."""
    return info.max_embed_len if chunks_inputs(info, task) else info.max_model_len


def _cap_name(info: ModelInfo, task: str | None) -> str:
    return "max_embed_len" if chunks_inputs(info, task) else "max_model_len"


def truncation_length(info: ModelInfo, params: PoolingParams) -> int | None:
    """How many tokens to keep, or None for no truncation (not asked, or -1 with no input cap)."""
    k = params.truncate_prompt_tokens
    if k is None:
        return None
    return input_cap(info, cap_task(params)) if k == -1 else k


def check_length(info: ModelInfo, n_tokens: int, task: str | None = None) -> None:
    """Reject an (untruncated) input of ``task`` that does not fit the model's input cap."""
    if n_tokens == 0:
        raise InvalidRequest("The decoder prompt cannot be empty", param="input")
    cap = input_cap(info, task)
    if cap is not None and n_tokens > cap:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {cap} tokens. "
            f"However, your prompt contains {n_tokens} input tokens, which exceeds this limit "
            "even without any output tokens. Please reduce the length of the input prompt.",
            param="input_tokens",
        )


def check_inputs(info: ModelInfo, inputs: Sequence[Input], task: str | None = None) -> None:
    """Each input is a valid Unicode text, a list of in-vocabulary token ids, a capped text, or (for a
    cross-encoder's ``task``, when known) a text pair."""
    if not inputs:
        raise InvalidRequest("You must pass at least one prompt", param="input")
    for x in inputs:
        if isinstance(x, str):
            _check_text(x)
        elif isinstance(x, TextPair):
            _check_pair(x, task)
        elif isinstance(x, CappedText):
            _check_text(x.text)
            _check_cap(x.max_tokens)
        elif isinstance(x, ChatInput):
            _check_chat(x)
        elif isinstance(x, WindowedText):
            _check_windowed(x, task)
        elif isinstance(x, LateChunkText):
            _check_late(info, x, task, inputs)
        elif isinstance(x, list) and all(_is_token_id(t) for t in x):
            check_token_ids(info, x)
        elif isinstance(x, MediaInput):  # its text parts; its media are the model's plan's to read (or refuse)
            for part in x.parts:
                if isinstance(part, str):
                    _check_text(part)
        else:
            raise InvalidRequest(
                "each input must be a string or a list of non-negative integer token ids", param="input"
            )


def _check_pair(pair: TextPair, task: str | None) -> None:
    if task is not None and task not in PAIR_TASKS:
        raise InvalidRequest(
            f"Text pairs are read by a cross-encoder (task 'classify'), not by task '{task}'.", param="input"
        )
    _check_text(pair.text)
    _check_text(pair.text_pair)
    _check_cap(pair.max_text_tokens)
    _check_cap(pair.max_pair_tokens)


def _check_windowed(doc: WindowedText, task: str | None) -> None:
    """A document to read in windows: valid texts and caps, at least one window, a non-negative overlap."""
    if doc.query is not None:
        _check_pair(TextPair(doc.query, doc.text, doc.max_query_tokens, doc.max_tokens), task)
    else:
        _check_text(doc.text)
        _check_cap(doc.max_tokens)
    if not _is_token_id(doc.max_windows) or doc.max_windows < 1:
        raise InvalidRequest(
            f"max_chunks_per_doc must be at least 1, got {doc.max_windows!r}.", param="max_chunks_per_doc"
        )
    if not _is_token_id(doc.overlap):
        raise InvalidRequest(
            f"chunk_overlap must be a non-negative integer, got {doc.overlap!r}.", param="chunk_overlap"
        )


def _check_late(info: ModelInfo, doc: LateChunkText, task: str | None, inputs: Sequence[Input]) -> None:
    """A late-chunking document: valid text and boundaries, embed on a model with token vectors, alone."""
    _check_text(doc.text)
    check_late(doc)
    if task is not None and task != "embed":
        raise InvalidRequest(f"late chunking embeds chunks (task 'embed'), not task '{task}'", param="late_chunking")
    if TOKEN_TASK not in info.tasks:
        raise InvalidRequest(
            f"late chunking needs the model's token vectors (task '{TOKEN_TASK}'), which "
            f"{info.served_model_name} does not serve",
            param="late_chunking",
        )
    if not all(isinstance(x, LateChunkText) for x in inputs):
        raise InvalidRequest("a late-chunking call holds late-chunking documents only", param="late_chunking")


def _check_chat(chat: ChatInput) -> None:
    """A conversation: at least one message, each a dict whose text content is valid Unicode."""
    if not chat.messages or not all(isinstance(m, dict) for m in chat.messages):
        raise InvalidRequest("a conversation needs at least one message object", param="messages")
    for message in chat.messages:
        if isinstance(message.get("content"), str):
            _check_text(message["content"])


def _check_cap(k: object) -> None:
    if not _is_token_id(k):
        raise InvalidRequest("a per-text token cap must be a non-negative integer", param="input")


def check_tokens(tokens: int, cap: int | None) -> None:
    """A call's counted tokens against ``--max-tokens-per-request`` (None: no cap)."""
    if cap is not None and tokens > cap:
        raise InvalidRequest(
            f"The request's inputs have {tokens} tokens; the limit is {cap} tokens per request "
            "(--max-tokens-per-request).",
            param="input",
        )


def check_token_call(info: ModelInfo, call: TokenCall) -> None:
    """A worker's check of a tokenized call at its own boundary: its params, each sequence's length against
    the input cap, every id in the vocabulary (never a 500 in a batch)."""
    check_params(info, call.params)
    task = cap_task(call.params)
    for n in call.lengths():
        check_length(info, n, task)
    if len(call.ids) and (int(call.ids.min()) < 0 or (info.vocab_size and int(call.ids.max()) >= info.vocab_size)):
        bad = int(call.ids.min()) if int(call.ids.min()) < 0 else int(call.ids.max())
        raise InvalidRequest(
            f"Token id {bad} is out of vocabulary (the model has {info.vocab_size} tokens).", param="input"
        )


def check_token_ids(info: ModelInfo, ids: list[int]) -> None:
    """Reject token ids the model's embedding table does not have (never a 500 in a batch)."""
    if info.vocab_size is not None and ids and max(ids) >= info.vocab_size:
        raise InvalidRequest(
            f"Token id {max(ids)} is out of vocabulary (the model has {info.vocab_size} tokens).", param="input"
        )


def _check_text(text: str) -> None:
    """Texts must be valid Unicode: JSON can carry lone surrogates that no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"input text is not valid Unicode ({exc.reason} at position {exc.start})", param="input"
        ) from None


def _is_token_id(t: object) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0
