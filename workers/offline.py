"""The offline Python API: one model in this process, no server, numpy arrays out.

``PoolingModel`` (also exported as ``LLM``, for vLLM users) loads a model once
with ``workers.load.build.load_model`` and runs the worker's own ``Engine`` (the
same input checks, scheduler, runner and poolers a server uses) on a private
asyncio loop in a daemon thread. Each method blocks its caller until the
engine answers, so it works from plain synchronous code and from inside a
running loop (an ``async def``, a Jupyter cell) alike; calls from several
threads batch together. All inputs of one method call travel as ONE
``PoolingCall``, so they are tokenized together and packed into batches by
token budget. Errors are poolgate's typed errors (``shared.domain.errors``) with
vLLM's messages.

- ``embed`` → ``(n, dim)``; ``classify`` → ``(n, num_labels)`` (names in ``labels``);
- ``encode(pooling_task=...)`` → one array per input (``(T, dim)`` for token tasks);
- ``submit(inputs, params)`` → the whole ``PoolingResult`` (outputs and each input's token count);
- ``score(queries, documents)`` runs the score routes' own plan
  (``shared.domain.score_plan``): pairs 1:1, 1:N or N:N (pairwise by index) as
  vLLM does, per-side caps, and the active task's scorer: cosine of the
  ``embed`` vectors for a bi-encoder, MaxSim of the ``token_embed`` vectors
  for late interaction (each query and document pooled once), and for a
  one-label cross-encoder (``classify``) one forward per pair, the pair read
  as one sequence (``shared.wire.messages.TextPair``).

Constructor flags are the CLI's model flags as keywords, the settings of
``shared.config.model_settings.ModelSettings`` (``dtype``, ``backend``,
``max_model_len``, ``max_batch_tokens``, ``hf_overrides``, ``num_threads``,
``tokenizer_threads``, ...), with
``pooler_config`` (vLLM's PoolerConfig, or its dict) and its aliases
``pooling_type`` and ``normalize``; they are checked here, at this edge.
``num_threads`` sets torch's threads for the whole process. ``close()`` (or
leaving a ``with`` block, or garbage collection, or interpreter exit) stops
the engine and the loop thread. At exit, the models still open are closed by
a hook registered with ``threading._register_atexit`` when this module loads:
such hooks run last-registered first, so ours runs before
``concurrent.futures`` forbids new executor work (which ``Engine.stop`` needs:
a plain ``atexit`` or ``weakref.finalize`` hook runs too late and ends every
script with "cannot schedule new futures after interpreter shutdown").
"""
from __future__ import annotations

import asyncio
import concurrent.futures.thread  # noqa: F401  (its exit hook is registered before ours, so ours runs first)
import itertools
import threading
import weakref
from collections.abc import Coroutine, Iterable
from typing import Any

import numpy as np

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.errors import InvalidRequest, Unavailable
from poolgate.shared.domain.media_limits import MediaLimits, check_media_count
from poolgate.shared.config.model_flags import media_limits, worker_config
from poolgate.shared.config.model_settings import ModelSettings
from poolgate.shared.config.declare import declared
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.rows import Rows
from poolgate.shared.domain.score_plan import SideCaps, WindowSpec, plan_scores
from poolgate.shared.domain.tasks import REMOVED_TASKS
from poolgate.shared.wire.messages import Input, PoolingCall, PoolingResult
from poolgate.workers.engine.engine import Engine
from poolgate.workers.engine.runner_api import LoadedModel

Inputs = str | list[int] | Iterable[str | list[int]]  # one text, one token-id list, or a list of either

# Keyword flags: the model settings (``shared.config.model_settings``), the CLI's model flags by their dests, MODEL aside
FLAGS = frozenset(item.name for item in declared(ModelSettings)) - {"model"}
# the flags' checks, from their one declaration (shared.config.model_settings); pooling_type is upper-cased first (below)
CHOICES = {item.name: item.choices for item in declared(ModelSettings)
           if item.choices is not None and not item.about.upper}
POSITIVE = tuple(item.name for item in declared(ModelSettings) if item.kind is int and item.about.ge == 1)
NON_NEGATIVE = tuple(item.name for item in declared(ModelSettings) if item.kind is int and item.about.ge == 0)
NO_TASK = ("encode() needs pooling_task: one of 'embed', 'classify', 'token_embed' or 'token_classify' "
           "(or use embed(), classify() or score())")


def offline_config(model: str | None, flags: dict[str, Any]) -> WorkerConfig:
    """The WorkerConfig for ``PoolingModel(model, **flags)``; TypeError/ValueError for bad flags."""
    unknown = sorted(set(flags) - FLAGS)
    if unknown:
        raise TypeError(f"unknown flag(s) {', '.join(unknown)}; expected some of {', '.join(sorted(FLAGS))}")
    flags = dict(flags)
    for name, choices in CHOICES.items():
        if flags.get(name) is not None and flags[name] not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, got {flags[name]!r}")
    for name in (*POSITIVE, *NON_NEGATIVE):
        value, least = flags.get(name), 0 if name in NON_NEGATIVE else 1
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
            raise ValueError(f"{name} must be a {'non-negative' if least == 0 else 'positive'} integer, got {value!r}")
    for item in declared(ModelSettings):  # a table setting (pooler_config) may be given as its dict, as in the file
        if item.about.table is not None and isinstance(flags.get(item.name), dict):
            flags[item.name] = item.about.table(flags[item.name])
    if flags.get("pooler_config") is None:
        flags.pop("pooler_config", None)
    if isinstance(flags.get("pooling_type"), str):
        flags["pooling_type"] = flags["pooling_type"].upper()  # as the flag upper-cases it
    return worker_config(ModelSettings(model=model, **flags))


class _LoopThread:
    """An asyncio loop running in a daemon thread; ``run`` blocks the calling thread on a coroutine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="poolgate-offline-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:  # KeyboardInterrupt in the caller: the engine drops what is left of the call
            future.cancel()
            raise

    def close(self) -> None:
        self.run(self.loop.shutdown_default_executor())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def _shut_down(loop: _LoopThread, engine: Engine) -> None:
    """Stop the engine (joining its threads), then the loop and its thread; run once, by ``weakref.finalize``."""
    try:
        loop.run(engine.stop())
    finally:
        loop.close()


_OPEN: list[weakref.finalize] = []  # the closers of models not yet closed (dead ones pruned on each start)


def _close_open_models() -> None:
    """Close every model still open, while executors still take work (the interpreter is exiting)."""
    for closer in reversed(_OPEN):
        closer()
    _OPEN.clear()


threading._register_atexit(_close_open_models)


class PoolingModel:
    """A pooling model served in-process: ``embed``, ``classify``, ``encode``, ``score``; numpy out."""

    def __init__(self, model: str | None = None, **flags: Any):
        """Load ``model`` (a local folder; None = the bundled all-MiniLM-L6-v2) with WorkerConfig ``flags``."""
        from poolgate.workers.load.build import load_model  # torch loads here, not when this module is imported

        cfg = offline_config(model, flags)
        limits = media_limits(cfg)  # ValueError for an allowed_media_domains entry that is no host, before loading
        self._start(load_model(cfg), cfg.tokenizer_threads, limits)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, tokenizer_threads: int = 1) -> "PoolingModel":
        """Serve a model that is already loaded (any ``LoadedModel``, e.g. a test's fake)."""
        self = cls.__new__(cls)
        self._start(loaded, tokenizer_threads)
        return self

    def _start(self, loaded: LoadedModel, tokenizer_threads: int | None,
               limits: MediaLimits | None = None) -> None:
        self.info = loaded.info
        self._limits = limits or MediaLimits()
        self._ids = itertools.count()
        loop, engine = _LoopThread(), Engine(loaded, tokenizer_threads, media_limits=limits)
        try:
            loop.run(engine.start())
        except BaseException:
            loop.close()
            raise
        self._engine = engine
        self._closer = weakref.finalize(self, _shut_down, loop, engine)
        self._closer.atexit = False  # _close_open_models closes it at exit, before the executors stop
        _OPEN[:] = [c for c in _OPEN if c.alive] + [self._closer]
        self._loop = loop

    @property
    def labels(self) -> tuple[str, ...] | None:
        """The label of each ``classify`` / ``token_classify`` output column (None when the model has none)."""
        return self.info.labels

    def embed(self, inputs: Inputs, *, dimensions: int | None = None, use_activation: bool | None = None,
              truncate_prompt_tokens: int | None = None) -> np.ndarray:
        """(n, dim) float32 embeddings, L2-normalized unless ``use_activation=False``."""
        params = PoolingParams(task="embed", dimensions=dimensions, use_activation=use_activation,
                               truncate_prompt_tokens=truncate_prompt_tokens)
        return self._pool(inputs, params).values

    def classify(self, inputs: Inputs, *, use_activation: bool | None = None,
                 truncate_prompt_tokens: int | None = None) -> np.ndarray:
        """(n, num_labels) float32 probabilities (raw logits with ``use_activation=False``); see ``labels``."""
        params = PoolingParams(task="classify", use_activation=use_activation,
                               truncate_prompt_tokens=truncate_prompt_tokens)
        return self._pool(inputs, params).values

    def encode(self, inputs: Inputs, *, pooling_task: str | None = None, dimensions: int | None = None,
               use_activation: bool | None = None, truncate_prompt_tokens: int | None = None,
               input_type: str | None = None) -> list[np.ndarray]:
        """One array per input: ``(dim,)`` for ``embed``/``classify``, ``(T, dim)`` for the token tasks;
        ``input_type`` ``"query"`` or ``"document"``: the inputs' role for a PyLate ColBERT model (required there)."""
        if pooling_task is None:
            raise InvalidRequest(NO_TASK, param="pooling_task")
        if pooling_task in REMOVED_TASKS:
            raise InvalidRequest(REMOVED_TASKS[pooling_task], param="pooling_task")
        if input_type not in (None, "query", "document"):
            raise InvalidRequest(f"input_type is 'query' or 'document', got {input_type!r}", param="input_type")
        inputs = _as_inputs(inputs)
        roles = None if input_type is None else len(inputs) if input_type == "query" else 0
        params = PoolingParams(task=pooling_task, dimensions=dimensions, use_activation=use_activation,
                               truncate_prompt_tokens=truncate_prompt_tokens, query_inputs=roles)
        rows = self._pool(inputs, params)
        return [rows.item(i) for i in range(len(rows))]

    def score(self, queries: Inputs, documents: Inputs, *, truncate_prompt_tokens: int | None = None,
              instruction: str | None = None, max_tokens_per_query: int = 0, max_tokens_per_doc: int = 0,
              max_chunks_per_doc: int | None = None, chunk_overlap: int = 0,
              chunk_aggregation: str = "max") -> np.ndarray:
        """(pairs,) float32 scores of 1:1, 1:N or N:N (pairwise) query/document pairs, as vLLM's ``score``
        and the score routes (``shared.domain.score_plan``); ``instruction`` goes to a cross-encoder's score
        template (Qwen3-Reranker's ``<Instruct>``); ``max_tokens_per_*`` cut each side's texts (0 = off);
        ``max_chunks_per_doc`` reads long documents in token windows (``chunk_overlap``, ``chunk_aggregation``)."""
        windows = None if max_chunks_per_doc is None else WindowSpec(max_chunks_per_doc, chunk_overlap,
                                                                      chunk_aggregation)
        plan = plan_scores(self.info, _as_inputs(queries), _as_inputs(documents),
                           SideCaps(max_tokens_per_query, max_tokens_per_doc), instruction, windows)
        result = self.submit(plan.inputs, plan.params(truncate_prompt_tokens=truncate_prompt_tokens))
        return plan.scores(result.outputs, result.windows).values

    def close(self) -> None:
        """Stop the engine and the loop thread; safe to call more than once."""
        self._closer()

    def __enter__(self) -> "PoolingModel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        info, state = self.info, "" if self._closer.alive else ", closed"
        return (f"PoolingModel({info.served_model_name!r}, tasks={info.tasks}, backend={info.backend!r}, "
                f"dtype={info.dtype!r}{state})")

    def _pool(self, inputs: Inputs, params: PoolingParams) -> Rows:
        """All ``inputs`` through the engine as one call; their outputs as one block."""
        return self.submit(inputs, params).outputs

    def submit(self, inputs: Inputs, params: PoolingParams) -> PoolingResult:
        """``inputs`` as one call with ``params``, answered whole: the outputs (``Rows``) and each input's token
        count (``prompt_tokens``), as the Ray Data integration (``poolgate.integrations.ray``) needs them."""
        if not self._closer.alive:
            raise Unavailable("this PoolingModel is closed")
        call = PoolingCall(request_id=f"offline-{next(self._ids)}", model=self.info.served_model_name,
                           inputs=_as_inputs(inputs), params=params)
        check_media_count(call.inputs, self._limits)  # images and clips (MediaInput), as the gateway counts them
        return self._loop.run(self._engine.submit(call))


LLM = PoolingModel  # the name vLLM users reach for


def _as_inputs(inputs: Inputs) -> list[Input]:
    """A list of inputs: one text or one token-id list becomes a list of one; tuples and arrays become lists."""
    if isinstance(inputs, str):
        return [inputs]
    items = [x.tolist() if isinstance(x, np.ndarray) else list(x) if isinstance(x, tuple) else x
             for x in (inputs.tolist() if isinstance(inputs, np.ndarray) else inputs)]
    if items and all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return [items]
    return items
