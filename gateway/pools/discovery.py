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

from poolgate.gateway.pools import loras
from poolgate.gateway.pools.pool import WorkerPool
from poolgate.shared.telemetry.log_limit import LogLimiter
from poolgate.shared.wire.transport import WorkerClient, parse_address

log = logging.getLogger("poolgate.gateway.pools.discovery")
_repeats = LogLimiter(log, 60.0)  # re-resolved every 5 s: a lasting failure once a minute

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
    rest = url[len(DNS_SCHEME) :]
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
            raise ValueError(
                f"a worker URL must be tcp://host:port, unix:/path or dns+tcp://name:port, got {url!r}"
            ) from None
    return url


async def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (sorted, deduplicated), by the system resolver off the loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(ipaddress.ip_address(info[4][0])) for info in infos})


class Discovery:
    """The workers behind one ``dns+tcp://`` URL, kept in step with DNS (module doc).

    ``connect(url)`` dials one worker (the gateway's token and TLS); ``resolver(host,
    port)`` lists the addresses (injectable: tests use a fake). ``members`` maps each
    worker URL to its client.
    """

    def __init__(
        self,
        url: str,
        connect: Callable[[str], Awaitable[WorkerClient]],
        *,
        resolver: Resolver = resolve_host,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.url, self.name = url, parse_dns_url(url)
        self.connect, self.resolver, self.interval_s = connect, resolver, interval_s
        self.members: dict[str, object] = {}
        self.leaving: set[asyncio.Task] = set()  # removals of departed workers still draining

    async def first(self, timeout_s: float) -> list:
        """The workers that answer now; with ``timeout_s`` > 0, resolve again until one does (or time is up)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            added, _ = await self.sync(expected=None)
            if added or loop.time() + self.interval_s > deadline:
                return added
            log.info("waiting for workers behind %s", self.url)
            await asyncio.sleep(min(self.interval_s, 1.0))

    async def sync(self, expected: str | None, tokenizer: str | None = None) -> tuple[list, list]:
        """Resolve once; dial the new addresses (each must serve model ``expected``, with the tokenizer of
        sha256 ``tokenizer``, when given) and drop the gone ones from ``members``. Returns (clients added,
        clients gone). A failed lookup changes nothing."""
        try:
            addresses = await self.resolver(self.name.host, self.name.port)
        except OSError as exc:
            _repeats.log(
                logging.WARNING,
                (self.url, str(exc)),
                "cannot resolve %s: %s (keeping its %d workers)",
                self.url,
                exc,
                len(self.members),
            )
            return [], []
        urls = {self.name.worker_url(a) for a in addresses}
        gone = [self.members.pop(url) for url in sorted(set(self.members) - urls)]
        added = []
        for url in sorted(urls - set(self.members)):
            client = await self._join(url, expected, tokenizer)
            if client is not None:
                self.members[url] = client
                added.append(client)
        return added, gone

    async def _join(self, url: str, expected: str | None, tokenizer: str | None) -> WorkerClient | None:
        try:
            client = await self.connect(url)
        except Exception as exc:  # not up yet, refused our token, ...: tried again at the next round
            _repeats.log(logging.INFO, (url, str(exc)), "worker %s (from %s) not joining yet: %s", url, self.url, exc)
            return None
        if expected is not None:
            try:
                info = await client.info()
            except Exception as exc:  # dropped before it answered (restarting, a blip): the next round retries
                _repeats.log(
                    logging.INFO, (url, str(exc)), "worker %s (from %s) not joining yet: %s", url, self.url, exc
                )
                await client.close()
                return None
            why = None
            if info.served_model_name != expected:
                why = f"serves '{info.served_model_name}', not '{expected}'"
            elif info.tokenizer_sha256 != tokenizer:
                theirs = info.tokenizer_sha256
                why = f"tokenizes '{expected}' differently (tokenizer sha256 {theirs}, the pool's {tokenizer})"
            if why is not None:
                log.error("worker %s (from %s) %s: not added", url, self.url, why)
                await client.close()
                return None
        return client

    async def run(self, pool: WorkerPool) -> None:
        """Forever: every ``interval_s``, add the new workers to ``pool`` and drain-and-remove the gone ones."""
        while True:
            await asyncio.sleep(self.interval_s)
            added, gone = await self.sync(expected=pool.name, tokenizer=pool.info.tokenizer_sha256)
            for client in added:
                log.info("worker %s joins %s (from %s)", client.address, pool.name, self.url)
                await loras.restore(pool, client)  # the pool's run-time LoRA adapters, before it takes calls
                pool.add(client)
            for client in gone:  # drained in the background: new pods do not wait behind departing ones
                log.info("worker %s leaves %s (gone from %s)", client.address, pool.name, self.url)
                leaving = pool.remove(client) if any(c is client for c in pool.clients) else client.close()
                task = asyncio.create_task(leaving)
                self.leaving.add(task)
                task.add_done_callback(self.leaving.discard)
