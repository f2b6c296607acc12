"""Remote workers found by DNS: a ``dns+tcp://NAME:PORT`` URL re-resolved, its addresses joining and leaving a pool.

Kubernetes runs workers as a Deployment behind a headless Service
(``clusterIP: None``): its DNS name resolves to one A/AAAA record per ready
pod. Give the gateway ``dns+tcp://poolgate-workers.default.svc.cluster.local:9100``
(in a config file, ``[[models.remote]] url = ...``; on the command line,
``--worker-url``) and it resolves the name every ``interval_s`` seconds
(default 5): each address that appears is dialed as ``tcp://ADDRESS:PORT``
(with the gateway's worker token / TLS) and added to the model's pool once it
answers; each address that disappears is drained and removed. A failed lookup
keeps the current workers (DNS hiccups must not empty a pool). The gateway
then needs no list of pods and no cluster manager of its own.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from poolgate.shared.transport import parse_address

log = logging.getLogger("poolgate.gateway.discovery")

DNS_SCHEME = "dns+tcp://"
DEFAULT_INTERVAL_S = 5.0

Resolver = Callable[[str, int], Awaitable[list[str]]]


@dataclass(frozen=True)
class DnsName:
    host: str
    port: int

    def worker_url(self, address: str) -> str:
        """The tcp:// URL of one resolved address."""
        return f"tcp://[{address}]:{self.port}" if ":" in address else f"tcp://{address}:{self.port}"


def parse_dns_url(url: str) -> DnsName:
    """``dns+tcp://name:port`` as a DnsName; ValueError otherwise."""
    rest = url[len(DNS_SCHEME):]
    host, sep, port = rest.rpartition(":")
    if not url.startswith(DNS_SCHEME) or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a DNS worker URL must be dns+tcp://name:port, got {url!r}")
    return DnsName(host, int(port))


def is_dns_url(url: str) -> bool:
    return url.startswith(DNS_SCHEME)


def check_url(url: str) -> str:
    """``url`` if it is a worker URL the gateway can use (tcp://, unix:, dns+tcp://); ValueError otherwise."""
    if is_dns_url(url):
        parse_dns_url(url)
    else:
        try:
            parse_address(url)
        except ValueError:
            raise ValueError(f"a worker URL must be tcp://host:port, unix:/path or dns+tcp://name:port, "
                             f"got {url!r}") from None
    return url


async def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (sorted, deduplicated), by the system resolver off the loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(ipaddress.ip_address(info[4][0])) for info in infos})
