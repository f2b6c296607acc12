"""The model flags ``poolgate serve``, ``poolgate worker`` and the tools share, derived from one declaration.

Every flag is a setting of ``shared.config.model_settings.ModelSettings`` (name, type,
choices, default, bounds, help); ``add_model_arguments`` adds one flag per
setting, ``settings_from_args`` reads them back as a ModelSettings, and
``worker_config`` resolves that into the WorkerConfig (which extends
ModelSettings, so every setting is its field of the same name). The config
file's ``[[models]]`` table is derived from the same declaration
(``gateway.config.file``), so a flag, its file key and its WorkerConfig field
cannot drift.
"""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from typing import Any

from poolgate.shared.config.declare import declared
from poolgate.shared.config.flags import add_flags
from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.model_settings import ModelSettings
from poolgate.shared.config.models import resolve_model
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.shared.domain.media_limits import MediaLimits, media_host


def add_model_arguments(parser: argparse.ArgumentParser, declaration: type = ModelSettings) -> None:
    """MODEL and the flags that say how a worker loads and serves it: one per setting of ``declaration``."""
    add_flags(parser, declaration, "model")


def settings_from_args(args: argparse.Namespace) -> ModelSettings:
    """The ModelSettings of the model flags in ``args`` (each setting the dest of its name)."""
    return ModelSettings(**{item.name: getattr(args, item.name) for item in declared(ModelSettings)})


def folded_pooler(settings: ModelSettings) -> PoolerConfig:
    """``pooler_config`` with its alias settings folded in; ValueError when both say the same thing."""
    pooler = settings.pooler_config
    changes: dict[str, Any] = {}
    if settings.pooling_type is not None:
        if pooler.pooling_type or pooler.seq_pooling_type:
            raise ValueError("--pooling-type and --pooler-config's pooling type are both given")
        changes["seq_pooling_type"] = settings.pooling_type
    if settings.normalize is not None:
        if pooler.use_activation is not None:
            raise ValueError("--no-normalize and --pooler-config's use_activation are both given")
        changes["use_activation"] = settings.normalize
    return replace(pooler, **changes) if changes else pooler


def media_limits(settings: ModelSettings) -> MediaLimits:
    """The limits on the model's images and audio (``shared.domain.media_limits``); ValueError naming the flag
    for an ``--allowed-media-domains`` value that is not a host name or IP address."""
    hosts = []
    for text in settings.allowed_media_domains:
        try:
            hosts.append(media_host(text))
        except ValueError as exc:
            raise ValueError(f"--allowed-media-domains: {exc}") from None
    return MediaLimits(
        max_images_per_request=settings.max_images_per_request,
        max_image_pixels=settings.max_image_pixels,
        max_media_bytes=settings.max_media_bytes,
        max_audio_seconds=settings.max_audio_seconds,
        allowed_media_domains=tuple(dict.fromkeys(hosts)),
    )


def worker_config(settings: ModelSettings) -> WorkerConfig:
    """The WorkerConfig of ``settings``: MODEL resolved to its folder (FileNotFoundError if it is missing) and
    its served name, the pooler aliases folded into ``pooler_config`` (ValueError when they clash)."""
    path, name = resolve_model(settings.model)
    resolved = {
        "model": path,
        "served_model_name": settings.served_model_name or name,
        "pooler_config": folded_pooler(settings),
        "pooling_type": None,
        "normalize": None,
    }
    return WorkerConfig(**{**{f.name: getattr(settings, f.name) for f in fields(settings)}, **resolved})


def worker_config_from_args(args: argparse.Namespace) -> WorkerConfig:
    """The WorkerConfig the model flags describe; FileNotFoundError if the model folder is missing."""
    return worker_config(settings_from_args(args))
