"""Worker transport security: TLS contexts, the token comparison, and reading a token at the edge.

The handshake itself (``shared.wire.transport`` on the client, ``workers.server``
on the worker) is one frame: a worker configured with a token reads
``{"id": 0, "op": "hello", "token": ...}`` first and answers
``{"id": 0, "ok": true, ...}``, or an ``Unauthorized`` error frame and closes.
Tokens are compared in constant time and never logged. TLS is plain
``ssl``: the worker loads its certificate chain and key; the gateway trusts a
CA file or the system store and checks the host name (or ``tls_server_name``).
"""

from __future__ import annotations

import hmac
import ipaddress
import ssl
from collections.abc import Mapping
from pathlib import Path

from poolgate.shared.config.frozen import TransportSecurity

HELLO_ID = 0
TOKEN_ENV = "POOLGATE_WORKER_TOKEN"
MAX_HELLO_BYTES = 64 * 1024  # before a connection is authenticated, no frame may be bigger
HELLO_TIMEOUT_S = 10.0  # a connection that sends no hello in time is closed


def tokens_match(expected: str, given: object) -> bool:
    """Constant-time comparison; anything but a string is a mismatch."""
    if not isinstance(given, str):
        return False
    return hmac.compare_digest(expected.encode(), given.encode())


def server_context(security: TransportSecurity) -> ssl.SSLContext | None:
    """The worker's TLS context, or None when it has no certificate; ValueError if half-configured."""
    if (security.tls_cert is None) != (security.tls_key is None):
        raise ValueError("TLS needs both a certificate (--tls-cert) and its key (--tls-key)")
    if security.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(security.tls_cert, security.tls_key)
    return context


def client_context(security: TransportSecurity) -> ssl.SSLContext | None:
    """The gateway's TLS context for dialing TCP workers, or None without ``tls``."""
    if not security.tls:
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=security.tls_ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def is_loopback(host: str) -> bool:
    """Whether a bound host address only accepts connections from this machine."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return host == "localhost"


def read_token(token_file: str | None, environ: Mapping[str, str]) -> str | None:
    """The token from ``token_file`` (first line, stripped) or ``POOLGATE_WORKER_TOKEN``; None if neither.

    Called once at the CLI edge. A file that others can read is accepted, but an
    empty token is refused (it would authenticate anyone).
    """
    if token_file is not None:
        token = Path(token_file).read_text().strip()
        source = token_file
    elif environ.get(TOKEN_ENV) is not None:
        token, source = environ[TOKEN_ENV].strip(), TOKEN_ENV
    else:
        return None
    if not token:
        raise ValueError(f"the worker token in {source} is empty")
    return token
