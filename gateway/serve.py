"""``poolgate serve``: its flags (or ``--config FILE``), parsed once into a frozen GatewayConfig, then ``run_gateway``.

The flags describe one model (a one-entry config); ``--config`` reads a TOML file
with any number of models (``gateway.config.file``). Both go through
``gateway.config.build``. The flags are derived from their declarations: the
model's (``shared.config.model_settings``) and the gateway's (``gateway.config.settings``).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping

from poolgate.gateway.config.build import ModelEntry, config_from_entries
from poolgate.gateway.config.file import load_config
from poolgate.gateway.config.given import given
from poolgate.gateway.config.settings import GatewaySettings
from poolgate.gateway.launch import run_gateway
from poolgate.shared.config.flags import add_flags
from poolgate.shared.config.frozen import GatewayConfig
from poolgate.shared.config.model_flags import add_model_arguments, settings_from_args
from poolgate.shared.config.security_flags import add_gateway_security_arguments
from poolgate.shared.config.tracing_flags import add_tracing_arguments

log = logging.getLogger("poolgate")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="a TOML file with any number of [[models]] (see docs/operations.md); a flag given beside "
        "it overrides the file's value (a model flag: in every [[models]] table)",
    )
    add_model_arguments(p)
    add_flags(p, GatewaySettings)
    p.add_argument("--log-level", default="INFO")
    add_tracing_arguments(p)
    add_gateway_security_arguments(p)


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> GatewayConfig:
    """The GatewayConfig of the flags (one model) or of ``--config``'s file."""
    if args.config is not None:
        parser = argparse.ArgumentParser(add_help=False)
        add_arguments(parser)
        flags = {k: v for k, v in given(args).items() if k not in ("config", "log_level")}
        return load_config(args.config, parser, environ, flags)
    remote = tuple(args.worker_url)
    # --workers counts worker processes; left at its default, the pool takes one device's --replicas-per-device
    workers = args.workers if args.workers != 1 or "workers" in given(args) else None
    entry = ModelEntry(settings_from_args(args), replicas=0 if remote else workers, remotes=remote)
    return config_from_entries(args, [entry], environ)


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except (OSError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    return run_gateway(config)
