"""Run-time LoRA adapters as the gateway serves them: each a name routed to its base model's pools.

An adapter (``--lora-modules NAME=PATH`` at start, ``POST /v1/load_lora_adapter``
later: ``gateway.lora_routes``) is loaded on every worker of every pool of its
base model (the workers' ``lora`` op: ``workers.models.run_loras`` checks and
places it) before its name is routed; if one worker refuses, the ones that took
it unload it again and the refusal (400, naming why) is the answer. The router
(``gateway.pools.router``) then resolves the adapter's name to the base model's
pools and ``serving.resolve`` puts the name in the call's ``PoolingParams.lora``;
``/v1/models`` lists each adapter with ``root`` = its path and ``parent`` = its
base model. Unloading takes the name out of routing first, then off the workers.

A worker the supervisor starts again takes its pool's adapters before it takes
calls (``restore``). Each gateway process (``--gateway-processes``)
keeps its own list: load adapters at start (``--lora-modules``) there.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from poolgate.gateway.pools.router import LoraCard, Router
from poolgate.shared.domain.errors import InvalidRequest, ModelNotFound, PoolgateError

if TYPE_CHECKING:
    from poolgate.gateway.pools.member import Client
    from poolgate.gateway.pools.pool import WorkerPool

log = logging.getLogger("poolgate.gateway.loras")


def base_model(router: Router, name: str, parent: str | None) -> str:
    """The served base model an adapter named ``name`` goes on: ``parent``, or the only one served."""
    if name in router.pools:
        raise InvalidRequest(f"The lora adapter name '{name}' is the name of a served base model.", param="lora_name")
    if name in router.loras or name in router.loading:
        raise InvalidRequest(f"The lora adapter '{name}' has already been loaded.", param="lora_name")
    if parent is None:
        if len(router.pools) != 1:
            raise InvalidRequest(
                f"adapter '{name}': base_model_name is required when {len(router.pools)} models are served",
                param="base_model_name",
            )
        parent = next(iter(router.pools))
    model = router.pools.get(parent)
    if model is None:
        raise InvalidRequest(f"adapter '{name}': base model '{parent}' is not served", param="base_model_name")
    if not model.info.max_loras:
        raise InvalidRequest(
            f"adapter '{name}': model '{parent}' serves no LoRA adapters; start it with --max-loras N "
            "(a packed family: BERT, XLM-R, ModernBERT, GTE, Llama, Qwen, Gemma and the others)",
            param="lora_name",
        )
    return parent


async def load(router: Router, name: str, path: str, parent: str | None = None) -> LoraCard:
    """Load the adapter in ``path`` on every worker of its base model, then route ``name`` to it."""
    card = LoraCard(name, path, base_model(router, name, parent))
    clients = [client for pool in router.pools[card.parent].pools for client in pool.clients]
    done = []
    router.loading.add(name)  # a second load of the name is refused from here on
    try:
        for client in clients:
            await client.lora("load", name, path)
            done.append(client)
    except PoolgateError:
        for client in done:
            with contextlib.suppress(PoolgateError):
                await client.lora("unload", name)
        raise
    finally:
        router.loading.discard(name)
    router.loras[name] = card
    for pool in router.pools[card.parent].pools:
        pool.loras[name] = path  # a worker that restarts gets it again (``restore``)
    return card


async def unload(router: Router, name: str) -> LoraCard:
    """Stop routing ``name`` (404 if it is not loaded), then take it off its base model's workers."""
    card = router.loras.pop(name, None)
    if card is None:
        raise ModelNotFound(f"The lora adapter '{name}' cannot be found.", param="lora_name")
    model = router.pools.get(card.parent)
    for pool in model.pools if model is not None else []:
        pool.loras.pop(name, None)
        for client in pool.clients:
            with contextlib.suppress(PoolgateError):  # a worker that failed to take it again has it no more
                await client.lora("unload", name)
    return card


async def restore(pool: WorkerPool, client: Client) -> None:
    """Load ``pool``'s adapters on ``client`` (a worker the supervisor started again), before it takes calls;
    one it refuses is logged (its calls for that adapter then fail on this worker, never answer with the base)."""
    for name, path in list(pool.loras.items()):
        try:
            await client.lora("load", name, path)
        except PoolgateError as exc:
            log.error("worker %s of %s did not take LoRA adapter %r again: %s", client.address, pool.name, name, exc)
