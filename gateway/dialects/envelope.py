"""vLLM's list-response envelope for its native routes: ``{id, object: "list", created, model, data, usage}``."""
from __future__ import annotations

from poolgate.gateway.serving import Served


def usage(prompt_tokens: int) -> dict:
    """vLLM's ``UsageInfo`` as it dumps it: pooling has no completion tokens."""
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0,
            "prompt_tokens_details": None, "completion_tokens_details": None}


def list_response(prefix: str, served: Served, data: list[dict], *, created: int) -> dict:
    """The body around ``data``; its id is ``{prefix}-{request id}`` as vLLM makes it."""
    return {"id": f"{prefix}-{served.request_id}", "object": "list", "created": created,
            "model": served.info.served_model_name, "data": data, "usage": usage(served.result.total_tokens)}
