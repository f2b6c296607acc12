"""The API dialects: name -> a function that adds the dialect's routes to an app."""
from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from poolgate.gateway.dialects import openai, vllm_classify, vllm_pooling

DIALECTS: dict[str, Callable[[web.Application], None]] = {
    "openai": openai.register,
    "vllm_classify": vllm_classify.register,
    "vllm_pooling": vllm_pooling.register,
}
