"""``poolgate bench --images N``: images/s and tokens/s of an image embedder over HTTP.

The corpus is ``N`` synthetic ``--image-size`` square PNGs
(``shared.inputs.media.synthetic.bench_image``: smooth colour and noise, each
seed different, so the embedding cache never answers), each sent as a
base64 ``data:`` URL in vLLM's chat form of ``POST /v1/embeddings``: one
request per image, ``messages`` holding one user turn with one ``image_url``
part (vLLM embeds one conversation per request; ``--concurrency`` requests
in flight let the worker batch the images together). Bodies are serialized
before the clock starts; the load loop, its checks and the report are the
text bench's (``bench.load``, ``bench.report``): ``inputs_per_s`` is
images/s, and ``tokens_per_s`` counts the tokens the server reports (an
image's are its vision tower's patches: 50 for a ViT-B/32 at 224 px).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from poolgate.gateway.bench.load import LoadConfig
from poolgate.shared.config.flags import positive_int


def add_image_arguments(group: argparse._ArgumentGroup) -> None:
    """The image mode's flags (in the bench's ``modes`` group)."""
    group.add_argument(
        "--images",
        type=positive_int,
        default=None,
        metavar="N",
        help="image mode: N synthetic square PNGs, one per POST /v1/embeddings as a data: URL in a chat "
        "'messages' image_url part (vLLM's form); images/s and tokens/s (bench.images)",
    )
    group.add_argument(
        "--image-size", type=positive_int, default=224, metavar="PX", help="with --images: each image's side"
    )


def image_urls(count: int, size: int, seed: int) -> list[str]:
    """``count`` distinct ``size`` x ``size`` PNGs as base64 ``data:`` URLs."""
    from poolgate.shared.inputs.media.synthetic import bench_image, data_url

    return [data_url(bench_image(size, seed + i)) for i in range(count)]


def image_body(url: str, cfg: LoadConfig) -> dict[str, Any]:
    """One image's ``/v1/embeddings`` body in vLLM's chat form."""
    part = {"type": "image_url", "image_url": {"url": url}}
    return {
        "model": cfg.model,
        "messages": [{"role": "user", "content": [part]}],
        "encoding_format": cfg.encoding_format,
    }


def image_payloads(urls: list[str], cfg: LoadConfig) -> list[tuple[bytes, int]]:
    """One serialized body per image, each with its one input."""
    return [(json.dumps(image_body(url, cfg)).encode(), 1) for url in urls]


def image_corpus(args: argparse.Namespace) -> str:
    """How the report names the corpus."""
    return f"{args.images} synthetic {args.image_size}x{args.image_size} PNG images, seed={args.seed}"
