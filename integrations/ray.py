"""Ray Data: a callable class for ``Dataset.map_batches`` that runs the offline API, one model per actor.

``Dataset.map_batches(PoolingUDF, fn_constructor_kwargs=..., compute=n actors, num_cpus=c)`` (or ``num_gpus``)
starts ``n`` actors; each builds one ``PoolingUDF``, which loads one ``PoolingModel`` (``workers.offline``)
in ``__init__`` from ``model`` (None: the bundled all-MiniLM-L6-v2) and the offline API's keyword flags
(``dtype``, ``num_threads``, ``max_batch_tokens``, ``normalize``, ...), then answers each batch with ONE
engine call, tokenized together and packed into forward passes by token budget. Ray places, feeds and
scales the actors with its own resources (an actor given a GPU sees only that one, so ``backend`` auto
finds it); poolgate schedules nothing across them. ``map_batches_kwargs`` builds that call's keywords
(``compute=ActorPoolStrategy(...)``, which Ray 2.51 made the spelling of ``concurrency``).

The tasks (``OPTIONS``), each row one input:

- ``embed``: ``text_column`` → ``output_column`` (default ``embeddings``, Ray's vLLM stage's name), a
  fixed-size float32 vector per row; ``dimensions``, ``use_activation`` (False: not L2-normalized),
  ``truncate_prompt_tokens``;
- ``classify``: → ``probs``, ``(num_labels,)`` float32 probabilities per row (logits with
  ``use_activation=False``); ``labels`` names them and ``label_column`` writes each row's top label;
- ``score``: ``query_column`` and ``document_column`` → ``score``, float32, one pair per row, by the model's
  own scorer (cosine of embeddings, MaxSim, or a cross-encoder's one forward per pair).

``num_input_tokens`` (Ray's vLLM stage's name) is each row's token count after truncation, from the
engine's ``PoolingResult.prompt_tokens``; embed and classify write it unless ``num_input_tokens=False``.
Score rows have none: the offline ``score`` answers scores only, so asking for it there is refused.

Batches come as ``batch_format`` ``numpy`` (a dict of arrays), ``pandas`` or ``pyarrow``
(``integrations.batch_formats``; with ``pyarrow`` a vector column is a ``fixed_size_list<float>``). The
class is plain Python that Ray's actors call: importing this module imports neither Ray nor torch
(``map_batches_kwargs`` imports Ray, the class's ``__init__`` the offline API).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from poolgate.integrations.batch_formats import READ, WRITE, format_of
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.score_plan import scorer_of
from poolgate.shared.domain.tasks import PoolingTask

# what each task takes (beyond the columns and truncate_prompt_tokens); anything else given is refused
OPTIONS = {
    "embed": {"dimensions", "use_activation", "num_input_tokens"},
    "classify": {"use_activation", "label_column", "num_input_tokens"},
    "score": set(),
}
OUTPUT_COLUMNS = {"embed": "embeddings", "classify": "probs", "score": "score"}
TOKENS_COLUMN = "num_input_tokens"


def check_options(task: str, options: dict[str, Any]) -> None:
    """ValueError for an unknown task or an option (not None, not False) that ``task`` would ignore."""
    if task not in OPTIONS:
        raise ValueError(f"task must be one of {', '.join(OPTIONS)}, got {task!r}")
    wrong = sorted(k for k, v in options.items() if v is not None and v is not False and k not in OPTIONS[task])
    if wrong:
        raise ValueError(f"{', '.join(wrong)} does not apply to task {task!r} (it takes {sorted(OPTIONS[task])})")


class PoolingUDF:
    """One ``PoolingModel`` per Ray actor; ``__call__`` maps a batch to the batch with the task's columns."""

    def __init__(
        self,
        model: str | None = None,
        *,
        task: str = "embed",
        text_column: str = "text",
        query_column: str = "query",
        document_column: str = "document",
        output_column: str | None = None,
        dimensions: int | None = None,
        use_activation: bool | None = None,
        truncate_prompt_tokens: int | None = None,
        label_column: str | None = None,
        num_input_tokens: bool | None = None,
        **flags: Any,
    ):
        """Load ``model`` with the offline API's ``flags``; the other keywords are the task's (module doc)."""
        from poolgate.workers.offline import PoolingModel  # torch loads in the actor, not where this is imported

        check_options(
            task,
            {
                "dimensions": dimensions,
                "use_activation": use_activation,
                "label_column": label_column,
                "num_input_tokens": num_input_tokens,
            },
        )
        self.model = PoolingModel(model, **flags)
        info = self.model.info
        if task == "score":
            scorer_of(info)  # InvalidRequest now, not at the first batch, when the model scores no pairs
        elif task not in info.tasks:
            raise ValueError(f"{info.served_model_name} does not serve {task!r} (it serves {', '.join(info.tasks)})")
        if label_column is not None and self.model.labels is None:
            raise ValueError(f"label_column={label_column!r}: this model names no labels")
        self.task, self.label_column = task, label_column
        self.inputs = (query_column, document_column) if task == "score" else (text_column,)
        self.output_column = output_column or OUTPUT_COLUMNS[task]
        self.tokens = task != "score" and num_input_tokens is not False
        self.truncate_prompt_tokens = truncate_prompt_tokens
        self.params = (
            None
            if task == "score"
            else PoolingParams(
                task=cast(PoolingTask, task),
                dimensions=dimensions,
                use_activation=use_activation,
                truncate_prompt_tokens=truncate_prompt_tokens,
            )
        )
        self.width = dimensions or info.embedding_dim  # a row's vector or probabilities

    @property
    def labels(self) -> tuple[str, ...] | None:
        """classify: the label of each ``probs`` entry (None when the model names none)."""
        return self.model.labels

    def __call__(self, batch: Any) -> Any:
        """``batch`` (numpy dict, pandas or pyarrow) with the output column(s) added, row for row."""
        kind = format_of(batch)
        columns = [READ[kind](batch, name) for name in self.inputs]
        outputs = self.run(*columns) if len(columns[0]) else self.empty()
        for name, values in outputs.items():
            batch = WRITE[kind](batch, name, values)
        return batch

    def run(self, *columns: list[Any]) -> dict[str, np.ndarray]:
        """The new columns of one non-empty batch: ``(texts,)``, or ``(queries, documents)`` for score."""
        if self.params is None:  # score
            queries, documents = columns
            scores = self.model.score(queries, documents, truncate_prompt_tokens=self.truncate_prompt_tokens)
            return {self.output_column: scores}
        result = self.model.submit(columns[0], self.params)
        values = result.outputs.values  # (n, width) float32
        if len(values) != len(columns[0]):  # e.g. a column of ints, which the offline API reads as one token-id list
            raise ValueError(f"column {self.inputs[0]!r} must hold one text (or token-id list) per row")
        out = {self.output_column: values}
        if self.tokens:
            out[TOKENS_COLUMN] = np.asarray(result.prompt_tokens, dtype=np.int32)
        if self.label_column is not None:
            out[self.label_column] = np.asarray(self.labels, dtype=object)[values.argmax(axis=1)]
        return out

    def empty(self) -> dict[str, np.ndarray]:
        """The new columns of an empty batch (the engine refuses a call without inputs)."""
        if self.task == "score":
            return {self.output_column: np.zeros(0, np.float32)}
        out = {self.output_column: np.zeros((0, self.width), np.float32)}
        if self.tokens:
            out[TOKENS_COLUMN] = np.zeros(0, np.int32)
        if self.label_column is not None:
            out[self.label_column] = np.zeros(0, object)
        return out


def map_batches_kwargs(
    model: str | None = None,
    *,
    concurrency: int | tuple[int, ...] = 1,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    batch_size: int = 256,
    batch_format: str = "numpy",
    **udf: Any,
) -> dict[str, Any]:
    """``Dataset.map_batches`` keywords that run ``PoolingUDF(model, **udf)`` on a pool of ``concurrency``
    actors (``n``, ``(min, max)`` or ``(min, max, initial)``, as Ray's ``ActorPoolStrategy``), each with Ray's
    ``num_cpus`` / ``num_gpus``: ``ds.map_batches(**map_batches_kwargs(...))``. A CPU actor's model runs
    ``num_threads`` = its ``num_cpus`` unless ``udf`` says otherwise (Ray reserves cores but pins none, and
    the default would be a thread per core of the host in every actor). The task's options are checked
    here; the model's flags when each actor loads it."""
    check_options(udf.get("task", "embed"), {k: udf.get(k) for k in set().union(*OPTIONS.values())})
    if batch_format not in READ:
        raise ValueError(f"batch_format must be one of {', '.join(READ)}, got {batch_format!r}")
    if num_cpus is not None and not num_gpus and "num_threads" not in udf:
        udf["num_threads"] = max(1, int(num_cpus))
    resources = {k: v for k, v in (("num_cpus", num_cpus), ("num_gpus", num_gpus)) if v is not None}
    return {
        "fn": PoolingUDF,
        "fn_constructor_kwargs": {"model": model, **udf},
        "compute": actor_pool(concurrency),
        "batch_size": batch_size,
        "batch_format": batch_format,
        **resources,
    }


def actor_pool(concurrency: int | tuple[int, ...]) -> Any:
    """Ray's ``ActorPoolStrategy`` of ``n``, ``(min, max)`` or ``(min, max, initial)`` actors."""
    from ray.data import ActorPoolStrategy

    if isinstance(concurrency, int):
        return ActorPoolStrategy(size=concurrency)
    if len(concurrency) not in (2, 3):
        raise ValueError(f"concurrency is n, (min, max) or (min, max, initial), got {concurrency!r}")
    initial = concurrency[2] if len(concurrency) == 3 else None
    return ActorPoolStrategy(min_size=concurrency[0], max_size=concurrency[1], initial_size=initial)
