"""Maps a request's model name and task to the model's pools (``ModelPools``); models come and go at run time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from poolgate.gateway.pools.model_pools import ModelPools
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.shared.domain.errors import InvalidRequest, ModelNotFound, NotSupported
from poolgate.shared.domain.tasks import PoolingTask
from poolgate.shared.wire.messages import ModelInfo

# vLLM's name for the API of each task, used in its 501 "does not support" message.
TASK_APIS: dict[str, str] = {
    "embed": "Embeddings",
    "token_embed": "Embeddings",
    "classify": "Classification",
    "token_classify": "Pooling",
}


@dataclass(frozen=True)
class LoraCard:
    """One served run-time LoRA adapter (``gateway.pools.loras``): its name (a request's ``model``), its folder and
    its base model's name."""

    name: str
    path: str
    parent: str


class Router:
    """Served model name -> ModelPools (the model's pools, one per backend, in preference order).

    A request without a model goes to ``default``: the only model when exactly
    one is served, unless a default is named.
    """

    def __init__(self, pools: Iterable[WorkerPool | ModelPools] = (), *, default: str | None = None):
        self.pools: dict[str, ModelPools] = {}
        self.loras: dict[str, LoraCard] = {}  # run-time LoRA adapters by name (gateway.pools.loras)
        self.loading: set[str] = set()  # adapters being loaded on their workers, not routed yet
        self.named_default = default
        self.default: str | None = None
        for pool in pools:
            self.add(pool)
        if default is not None and default not in self.pools:
            raise ValueError(f"default model '{default}' is not served")

    def live_jobs(self) -> int:
        """Live jobs this gateway process has admitted and not yet ended, over every model and pool (a
        Batch API job sends fewer lines at once while there are any: ``gateway.jobs.batch_job``)."""
        return sum(pool.admission.live_jobs for model in self.pools.values() for pool in model.pools)

    def add(self, pool: WorkerPool | ModelPools) -> None:
        """Serve ``pool``'s model from now on; a WorkerPool of a model already served becomes its next
        (overflow) pool. ValueError if it does not fit the model (``ModelPools.add_pool``)."""
        if isinstance(pool, ModelPools):
            if pool.name in self.pools:
                raise ValueError(f"model '{pool.name}' is already served")
            self.pools[pool.name] = pool
        elif pool.name in self.pools:
            self.pools[pool.name].add_pool(pool)
        else:
            self.pools[pool.name] = ModelPools([pool])
        self._set_default()

    def remove(self, name: str) -> ModelPools:
        """Stop routing to model ``name`` (its calls in flight go on); ModelNotFound if it is not served."""
        model = self.pools.pop(name, None)
        if model is None:
            raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
        for adapter in [n for n, card in self.loras.items() if card.parent == name]:
            del self.loras[adapter]  # its workers go with the model
        self._set_default()
        return model

    def _set_default(self) -> None:
        if self.named_default is not None:
            self.default = self.named_default if self.named_default in self.pools else None
        else:
            self.default = next(iter(self.pools)) if len(self.pools) == 1 else None

    def worker_pools(self) -> Iterator[WorkerPool]:
        """Every WorkerPool of every model."""
        for model in list(self.pools.values()):
            yield from model.pools

    def lookup(self, model: str | None) -> ModelPools:
        """The pool for ``model`` (None or "" = the default), whatever its tasks."""
        pool = self.pools.get(model) if model else self._default_pool()
        if pool is None and model in self.loras:  # a LoRA adapter's name: its base model's pools
            pool = self.pools.get(self.loras[model].parent)
        if pool is None:
            raise ModelNotFound(f"The model `{model}` does not exist.", param="model")
        return pool

    def lora_of(self, model: str | None) -> str | None:
        """The run-time LoRA adapter ``model`` names (its calls carry it: ``PoolingParams.lora``), else None."""
        return model if model and model not in self.pools and model in self.loras else None

    def resolve(self, model: str | None, task: PoolingTask) -> ModelPools:
        """The pool for ``model`` (None or "" = the default) that serves ``task``."""
        pool = self.lookup(model)
        if task not in pool.info.tasks:
            api = TASK_APIS.get(task, task)
            raise NotSupported(f"The model does not support {api} API", param="model")
        return pool

    def _default_pool(self) -> ModelPools:
        if not self.pools:
            raise ModelNotFound("No model is served.", param="model")
        if self.default is None:
            names = ", ".join(sorted(self.pools)) or "none"
            raise InvalidRequest(
                f"`model` is required: this server serves several models ({names}).",
                param="model",
            )
        return self.pools[self.default]

    def models(self) -> list[ModelInfo]:
        return [pool.info for pool in self.pools.values()]

    @property
    def ready(self) -> bool:
        """True when at least one model is served and every pool has a ready worker."""
        return bool(self.pools) and all(pool.ready for pool in self.pools.values())

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()
