"""A call's ``http(s)`` image and audio URLs fetched before it is tokenized, within the model's media limits.

``fetch_media`` runs in the serving path (``gateway.serving.resolve``) before
the call goes to the tokenizer pool. It counts the call's media parts (every
``MediaRef`` of every ``MediaInput``) against ``--max-images-per-request``,
then fetches every ``http(s)`` reference and returns the call with each one's
bytes in place (``MediaRef.data``); ``data:`` URLs and base64 stay as they are
(the model's media plan decodes them). The rules, from
``MediaLimits`` (``shared.domain.media_limits``):

1. the URL is ``http`` or ``https`` with no user name or password, and its host
   is one of ``--allowed-media-domains`` exactly (spelled as ``media_host``
   spells it: case, a trailing dot and IDNA aside); none listed: no URL is
   fetched;
2. a URL whose host is an IP address is connected to as it is: listing an
   address allows it, even a private or loopback one;
3. a URL whose host is a name is resolved here (``GuardedResolver``, the
   connector's own resolver, so the address checked is the address connected
   to: no second lookup for a DNS rebinding to slip in); each address that is
   not global (private, loopback, link-local, multicast, reserved,
   unspecified, shared, an IPv4 address inside IPv6) is dropped unless that
   address itself is listed. A listed name that resolves only to such
   addresses is refused: listing ``images.example.com`` does not let it
   point at 127.0.0.1; listing ``images.internal 10.0.0.7`` lets that name
   reach that address;
4. redirects are followed by hand, at most ``max_redirects``, each hop's URL
   checked by 1 to 3 again (a redirect to a host not listed is refused);
5. the answer must be 200 and not compressed (``Accept-Encoding: identity``
   is asked: nothing is inflated here); its body is read in chunks and
   refused once it passes ``--max-media-bytes`` (a ``Content-Length`` over
   it: before reading); the whole fetch, hops included, must end within
   ``fetch_timeout_s``.

Every refusal is a 400 naming the input, the URL's host and the flag or rule;
never the URL's path, query or credentials. No cookies are kept, no proxy
from the environment is used, no client header is forwarded.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import replace
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.media_limits import MediaLimits, check_media_count, media_host
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.shared.wire.messages import PoolingCall

REDIRECTS = frozenset({301, 302, 303, 307, 308})
CHUNK = 64 * 1024
USER_AGENT = "poolgate-media-fetch"
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(Exception):
    """A fetch refused by the rules (module doc); its message names the host, never the rest of the URL."""


def media_count(call: PoolingCall) -> int:
    """The call's images and audio clips, every input together."""
    return sum(len(x.media) for x in call.inputs if isinstance(x, MediaInput))


def not_global(ip: Address) -> str | None:
    """Why ``ip`` is not a public address (``loopback``, ``private``, ...), or None when it is one. An IPv4
    address carried in IPv6 (mapped, 6to4) is judged as itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour
        if inner is not None:
            return not_global(inner)
    for kind in ("unspecified", "loopback", "link_local", "multicast", "reserved", "private"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    return None if ip.is_global else "not global"


class GuardedResolver(AbstractResolver):
    """The connector's resolver: a name's addresses, less those rule 3 of the module doc drops; ``Refused``
    when none is left."""

    def __init__(self, allowed: tuple[str, ...]):
        self.allowed = frozenset(allowed)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        name = host.rstrip(".")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM, family=family, flags=socket.AI_ADDRCONFIG
            )
        except OSError as exc:
            raise Refused(f"URL host {name} could not be resolved ({exc.strerror or exc})") from None
        kept: list[ResolveResult] = []
        dropped: list[str] = []
        for fam, _, proto, _, sockaddr in infos:
            text = str(sockaddr[0])
            ip = ipaddress.ip_address(text.split("%", 1)[0])
            why = not_global(ip)
            if why is not None and str(ip) not in self.allowed:
                dropped.append(f"{ip} ({why})")
                continue
            kept.append(
                {
                    "hostname": host,
                    "host": text,
                    "port": port,
                    "family": fam,
                    "proto": proto,
                    "flags": socket.AI_NUMERICHOST,
                }
            )
        if not kept:
            raise Refused(
                f"URL host {name} resolves to {', '.join(dict.fromkeys(dropped))}, an address --allowed-media-domains "
                "does not list (a name reaches a private, loopback or link-local address only when that address "
                "is listed too)"
            )
        return kept

    async def close(self) -> None:
        return None


def check_url(url: URL, limits: MediaLimits) -> str:
    """The host of ``url`` (``media_host`` spelling) when rule 1 of the module doc lets it be fetched."""
    if url.scheme not in ("http", "https") or not url.raw_host:
        raise Refused("the URL is not an http(s) URL with a host")
    try:
        host = media_host(url.raw_host)
    except ValueError:
        raise Refused("the URL's host is not a host name or IP address") from None
    if url.user is not None or url.password is not None:
        raise Refused(f"URLs with a user name or password are not fetched (host {host})")
    if not limits.allowed_media_domains:
        raise Refused(
            "URLs are not fetched by this server (send a data: URL or base64, or start it with "
            "--allowed-media-domains naming the host)"
        )
    if host not in limits.allowed_media_domains:
        raise Refused(f"URL host {host} is not in --allowed-media-domains")
    return host


async def fetch_one(session: aiohttp.ClientSession, ref: MediaRef, limits: MediaLimits) -> bytes:
    """The bytes of one ``http(s)`` reference by the rules of the module doc; ``Refused`` otherwise."""
    url = URL(ref.url)
    for _ in range(limits.max_redirects + 1):
        host = check_url(url, limits)
        try:
            async with session.get(url, allow_redirects=False) as response:
                if response.status in REDIRECTS and "Location" in response.headers:
                    url = url.join(URL(response.headers["Location"]))
                    continue
                if response.status != 200:
                    raise Refused(f"URL host {host} answered HTTP {response.status}, not 200")
                return await _read(response, host, limits.max_media_bytes)
        except TimeoutError:
            raise
        except aiohttp.ClientError as exc:
            raise Refused(f"URL host {host} could not be reached ({_reason(exc)})") from None
        except ValueError as exc:  # yarl: a Location that is no URL
            raise Refused(f"URL host {host} sent a redirect that is not a URL ({exc})") from None
    raise Refused(f"URL host {url.host} redirected more than {limits.max_redirects} times")


async def _read(response: aiohttp.ClientResponse, host: str, cap: int) -> bytes:
    """The body, refused past ``cap`` bytes (rule 5)."""
    too_big = f"URL host {host} sent more than this server's --max-media-bytes {cap:,}"
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise Refused(f"URL host {host} sent a compressed body (Content-Encoding {encoding[:20]}), asked for none")
    if response.content_length is not None and response.content_length > cap:
        raise Refused(too_big)
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(CHUNK):
        size += len(chunk)
        if size > cap:
            raise Refused(too_big)
        chunks.append(chunk)
    return b"".join(chunks)


def _reason(exc: BaseException) -> str:
    """A client error's cause without the URL it may carry (its OS error, else its type)."""
    cause = getattr(exc, "os_error", None) or exc.__cause__
    if isinstance(cause, Refused):
        return str(cause)
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror.lower()
    return type(exc).__name__


def session(limits: MediaLimits) -> aiohttp.ClientSession:
    """A client session for one call's fetches: the guarded resolver, no DNS cache, no cookies, no proxy."""
    connector = aiohttp.TCPConnector(
        resolver=GuardedResolver(limits.allowed_media_domains), use_dns_cache=False, limit=8
    )
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
        timeout=aiohttp.ClientTimeout(total=limits.fetch_timeout_s),
        trust_env=False,
        auto_decompress=False,  # asked for identity: a compressed body is refused, never inflated here
    )


async def fetch_media(call: PoolingCall, limits: MediaLimits) -> PoolingCall:
    """``call`` counted against ``--max-images-per-request`` and its ``http(s)`` references fetched (module
    doc); the call itself when it has none to fetch. Raises the 400 of the first input that failed."""
    check_media_count(call.inputs, limits)
    remote = [(i, ref) for i, x in enumerate(call.inputs) if isinstance(x, MediaInput) for ref in x.media if ref.remote]
    if not remote:
        return call
    for i, ref in remote:  # every URL's host checked before any is fetched
        try:
            check_url(URL(ref.url), limits)
        except Refused as exc:
            raise _invalid(i, ref, exc) from None
        except ValueError:  # yarl's message would repeat the URL
            raise _invalid(i, ref, Refused("URL is not a valid URL")) from None
    async with session(limits) as client:
        got = await asyncio.gather(*(_fetch(client, ref, limits) for _, ref in remote), return_exceptions=True)
    fetched: dict[int, bytes] = {}
    for (i, ref), body in zip(remote, got, strict=True):
        if isinstance(body, Refused):
            raise _invalid(i, ref, body)
        if isinstance(body, BaseException):
            raise body
        fetched[id(ref)] = body
    inputs = [_with_bytes(x, fetched) for x in call.inputs]
    return replace(call, inputs=inputs)


async def _fetch(client: aiohttp.ClientSession, ref: MediaRef, limits: MediaLimits) -> bytes:
    """``fetch_one`` within the fetch time-out (rule 5)."""
    try:
        async with asyncio.timeout(limits.fetch_timeout_s):
            return await fetch_one(client, ref, limits)
    except TimeoutError:
        raise Refused(f"URL host {URL(ref.url).host} did not answer within {limits.fetch_timeout_s:g} s") from None


def _with_bytes(x: Any, fetched: dict[int, bytes]) -> Any:
    if not isinstance(x, MediaInput) or not any(id(p) in fetched for p in x.parts):
        return x
    parts = tuple(
        replace(p, data=fetched[id(p)]) if isinstance(p, MediaRef) and id(p) in fetched else p for p in x.parts
    )
    return replace(x, parts=parts)


def _invalid(i: int, ref: MediaRef, exc: Exception) -> InvalidRequest:
    where = f"input[{i}]"
    return InvalidRequest(f"{where}: {ref.kind} {exc}", param=where)
