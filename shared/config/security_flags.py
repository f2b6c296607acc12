"""The transport-security flags of ``poolgate worker`` and ``poolgate serve``, parsed into TransportSecurity.

The worker side (``--token-file`` or ``POOLGATE_WORKER_TOKEN``, ``--tls-cert`` /
``--tls-key``, ``--insecure-no-token``) says what the worker requires; the
gateway side (``--worker-token-file`` or the same variable, ``--worker-tls``,
``--worker-tls-ca``, ``--worker-tls-server-name``) says what the gateway
presents to the workers it dials by URL. The token is read here, at the edge,
and never put in argv: a flag names the file that holds it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from poolgate.shared.config.frozen import TransportSecurity
from poolgate.shared.wire.transport import parse_address
from poolgate.shared.wire.transport_security import TOKEN_ENV, is_loopback, read_token


def add_worker_security_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("transport security (who may use this worker)")
    g.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help=f"require the token in FILE (first line) on every connection (default: ${TOKEN_ENV})",
    )
    g.add_argument("--tls-cert", default=None, metavar="PEM", help="serve TLS with this certificate chain")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="... and this private key")
    g.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="allow a TCP listener beyond loopback without a token (anyone who reaches it can use it)",
    )


def add_gateway_security_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("worker transport security (for --worker-url workers)")
    g.add_argument(
        "--worker-token-file",
        default=None,
        metavar="FILE",
        help=f"send the token in FILE (first line) to remote workers (default: ${TOKEN_ENV})",
    )
    g.add_argument("--worker-tls", action="store_true", help="dial tcp:// workers over TLS")
    g.add_argument(
        "--worker-tls-ca",
        default=None,
        metavar="PEM",
        help="trust workers' certificates signed by this CA (default: the system trust store)",
    )
    g.add_argument(
        "--worker-tls-server-name",
        default=None,
        metavar="NAME",
        help="the name workers' certificates carry (default: the host in each worker URL)",
    )


def worker_security_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> TransportSecurity:
    """What the worker listening on ``args.listen`` requires; OSError for a missing file; ValueError for an
    empty token, half a TLS pair, TLS on a Unix socket, or a non-loopback TCP listener without a token
    (checked again on the bound socket by ``workers.listener``, but here before the model loads)."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    security = TransportSecurity(
        token=read_token(args.token_file, environ),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        insecure_no_token=args.insecure_no_token,
    )
    addr = parse_address(args.listen)
    if addr.kind == "unix" and security.tls_cert is not None:
        raise ValueError("--tls-cert is for a tcp:// listener; a Unix socket is protected by its permissions")
    remote = addr.kind == "tcp" and not is_loopback(addr.host or "")
    if remote and security.token is None and not args.insecure_no_token:
        raise ValueError(
            f"--listen {args.listen} accepts other hosts, so it needs a token: --token-file FILE or "
            f"${TOKEN_ENV} (or --insecure-no-token to accept anyone who can reach it)"
        )
    return security


def gateway_security_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> TransportSecurity:
    """What the gateway presents to remote workers; ValueError/OSError as ``worker_security_from_args``."""
    if args.worker_tls_ca is not None and not args.worker_tls:
        raise ValueError("--worker-tls-ca needs --worker-tls")
    return TransportSecurity(
        token=read_token(args.worker_token_file, environ),
        tls=args.worker_tls,
        tls_ca=args.worker_tls_ca,
        tls_server_name=args.worker_tls_server_name,
    )
