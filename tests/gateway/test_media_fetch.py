"""``gateway.media_fetch``: a call's image URLs fetched from a real aiohttp server on 127.0.0.1, by its rules.

The rule for addresses (the module doc): a host is fetched from only when it
is listed in ``--allowed-media-domains`` exactly; an IP address listed is
connected to as it is, even a loopback one; a listed *name* reaches a
non-global address (loopback, private, link-local, ...) only when that address
is listed too. So ``localhost`` alone is refused (it resolves to loopback),
``localhost 127.0.0.1`` is fetched, connecting to 127.0.0.1 only.
"""
from __future__ import annotations

import asyncio
import base64
import io
import ipaddress
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from PIL import Image

from poolgate.gateway.media_fetch import GuardedResolver, Refused, fetch_media, media_count, not_global
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.shared.wire.messages import PoolingCall


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 10, 30)).save(out, format="PNG")
    return out.getvalue()


PNG = png()
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


class Images:
    """The test's image server: its routes, and how often each was asked."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        app = web.Application()
        app.router.add_get("/{name}", self.answer)
        self.server = TestServer(app, host="127.0.0.1")

    async def answer(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.hits[name] = self.hits.get(name, 0) + 1
        if name == "img.png":
            return web.Response(body=PNG, content_type="image/png")
        if name == "redirect":
            raise web.HTTPFound(request.query["to"])
        if name == "loop":
            raise web.HTTPFound("/loop")
        if name == "big":
            return web.Response(body=b"x" * 5000)
        if name == "streamed":  # no Content-Length: the cap holds while reading
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            for _ in range(10):
                await response.write(b"y" * 500)
            await response.write_eof()
            return response
        if name == "gzipped":
            import gzip

            return web.Response(body=gzip.compress(bytes(100_000)), headers={"Content-Encoding": "gzip"})
        if name == "ua":
            return web.Response(body=request.headers.get("Accept-Encoding", "").encode())
        if name == "slow":
            await asyncio.sleep(5)
            return web.Response(body=PNG)
        return web.Response(status=404, text="nothing here")

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.server.port}/{path}"


@pytest.fixture
async def images():
    server = Images()
    await server.server.start_server()
    yield server
    await server.server.close()


def call_of(*parts) -> PoolingCall:
    return PoolingCall(request_id="r", model="m", inputs=[MediaInput(tuple(parts))], params=PoolingParams(task="embed"))


def image(url: str) -> MediaRef:
    return MediaRef("image", url=url)


async def refused(call: PoolingCall, limits: MediaLimits) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        await fetch_media(call, limits)
    assert info.value.status == 400
    return info.value


LOCAL = MediaLimits(allowed_media_domains=("127.0.0.1",))


async def test_a_listed_host_is_fetched_and_the_bytes_put_in_place(images):
    call = PoolingCall(request_id="r", model="m", params=PoolingParams(task="embed"), inputs=[
        "plain text", MediaInput(("a photo:", image(images.url("img.png")), image(DATA_URL)))])
    fetched = await fetch_media(call, LOCAL)
    text, media = fetched.inputs
    assert text == "plain text" and media.parts[0] == "a photo:"
    assert media.parts[1].data == PNG and media.parts[1].url == images.url("img.png") and not media.parts[1].remote
    assert media.parts[2] is call.inputs[1].parts[2]  # a data: URL stays for the plan to decode
    assert call.inputs[1].parts[1].data is None  # the call itself is not changed
    assert await fetch_media(call_of("text only"), LOCAL) == call_of("text only")


async def test_urls_are_not_fetched_by_default(images):
    error = await refused(call_of(image(images.url("img.png"))), MediaLimits())
    assert "input[0]: image URLs are not fetched by this server" in error.message
    assert "--allowed-media-domains" in error.message and error.param == "input[0]"
    assert images.hits == {}


async def test_a_host_not_listed_is_refused_before_anything_is_fetched(images):
    call = PoolingCall(request_id="r", model="m", params=PoolingParams(task="embed"), inputs=[
        MediaInput((image(images.url("img.png")),)), MediaInput((image("https://example.com/cat.png"),))])
    error = await refused(call, LOCAL)
    assert error.message == "input[1]: image URL host example.com is not in --allowed-media-domains"
    clip = MediaRef("audio", url="https://sounds.example/a.wav", format="wav")
    error = await refused(call_of("listen", clip), LOCAL)
    assert error.message == "input[0]: audio URL host sounds.example is not in --allowed-media-domains"
    assert images.hits == {}


async def test_a_listed_name_that_resolves_to_loopback_needs_its_address_listed(images):
    error = await refused(call_of(image(images.url("img.png", "localhost"))),
                          MediaLimits(allowed_media_domains=("localhost",)))
    assert "URL host localhost resolves to" in error.message and "(loopback)" in error.message
    assert images.hits == {}
    both = MediaLimits(allowed_media_domains=("localhost", "127.0.0.1"))
    fetched = await fetch_media(call_of(image(images.url("img.png", "LocalHost"))), both)
    assert fetched.inputs[0].media[0].data == PNG


async def test_the_resolver_keeps_only_the_addresses_the_rules_allow():
    with pytest.raises(Refused, match="loopback"):
        await GuardedResolver(("localhost",)).resolve("localhost", 80)
    kept = await GuardedResolver(("localhost", "127.0.0.1")).resolve("localhost", 80)
    assert [r["host"] for r in kept] == ["127.0.0.1"]  # ::1, if localhost has it, is not listed: dropped


@pytest.mark.parametrize("address, why", [
    ("127.0.0.1", "loopback"), ("10.1.2.3", "private"), ("192.168.0.1", "private"), ("172.16.0.1", "private"),
    ("169.254.169.254", "link-local"), ("0.0.0.0", "unspecified"), ("224.0.0.1", "multicast"),
    ("100.64.0.1", "not global"), ("240.0.0.1", "reserved"), ("::1", "loopback"), ("fe80::1", "link-local"),
    ("fc00::1", "private"), ("::ffff:127.0.0.1", "loopback"), ("2002:7f00:1::1", "loopback"), ("ff02::1", "multicast"),
    ("8.8.8.8", None), ("2606:4700:4700::1111", None), ("::ffff:8.8.8.8", None),
])
def test_what_counts_as_not_global(address, why):
    assert not_global(ipaddress.ip_address(address)) == why


async def test_a_redirect_to_a_host_not_listed_is_refused(images):
    to = images.url("img.png", "localhost")
    error = await refused(call_of(image(images.url(f"redirect?to={to}"))), LOCAL)
    assert error.message == "input[0]: image URL host localhost is not in --allowed-media-domains"
    assert images.hits == {"redirect": 1}


async def test_redirects_are_followed_up_to_the_limit(images):
    fetched = await fetch_media(call_of(image(images.url("redirect?to=/img.png"))), LOCAL)
    assert fetched.inputs[0].media[0].data == PNG
    clip = MediaRef("audio", url=images.url("redirect?to=/img.png"), format="wav")
    assert (await fetch_media(call_of(clip), LOCAL)).inputs[0].media[0] == MediaRef(
        "audio", url=clip.url, data=PNG, format="wav")  # an audio clip fetched alike, its format kept
    error = await refused(call_of(image(images.url("loop"))), LOCAL)
    assert "image URL host 127.0.0.1 redirected more than 3 times" in error.message
    assert images.hits["loop"] == 4


@pytest.mark.parametrize("path", ["big", "streamed"])
async def test_the_size_cap_holds_with_and_without_a_content_length(images, path):
    limits = MediaLimits(allowed_media_domains=("127.0.0.1",), max_media_bytes=1000)
    error = await refused(call_of(image(images.url(path))), limits)
    assert error.message == "input[0]: image URL host 127.0.0.1 sent more than this server's --max-media-bytes 1,000"


async def test_a_compressed_body_is_refused_never_inflated(images):
    error = await refused(call_of(image(images.url("gzipped"))), LOCAL)
    assert error.message == "input[0]: image URL host 127.0.0.1 sent a compressed body (Content-Encoding gzip), " \
                            "asked for none"
    fetched = await fetch_media(call_of(image(images.url("ua"))), LOCAL)
    assert fetched.inputs[0].media[0].data == b"identity"


async def test_a_slow_host_times_out(images):
    limits = MediaLimits(allowed_media_domains=("127.0.0.1",), fetch_timeout_s=0.3)
    start = time.perf_counter()
    error = await refused(call_of(image(images.url("slow"))), limits)
    assert time.perf_counter() - start < 2
    assert error.message == "input[0]: image URL host 127.0.0.1 did not answer within 0.3 s"


async def test_an_answer_other_than_200_names_the_host_only(images):
    error = await refused(call_of(image(images.url("secret-path-404?token=abc"))), LOCAL)
    assert error.message == "input[0]: image URL host 127.0.0.1 answered HTTP 404, not 200"


async def test_credentials_in_the_url_are_refused_and_never_echoed(images):
    url = images.url("img.png").replace("http://", "http://alice:hunter2@")
    error = await refused(call_of(image(url)), LOCAL)
    assert "user name or password" in error.message and "hunter2" not in error.message and "alice" not in error.message
    assert images.hits == {}


async def test_a_closed_port_is_a_400():
    error = await refused(call_of(image("http://127.0.0.1:9/img.png")), LOCAL)
    assert error.message.startswith("input[0]: image URL host 127.0.0.1 could not be reached (")


@pytest.mark.parametrize("url, message", [
    ("ftp://127.0.0.1/x.png", None),  # not remote: the plan's decoder says what a media URL must be
    ("http://127.0.0.1:99999/x.png", "URL is not a valid URL"),
])
async def test_odd_urls(url, message):
    call = call_of(image(url))
    if message is None:
        assert await fetch_media(call, LOCAL) is call
    else:
        assert message in (await refused(call, LOCAL)).message


async def test_too_many_images_is_a_400_before_any_fetch(images):
    parts = [image(images.url("img.png")) for _ in range(17)]
    call = PoolingCall(request_id="r", model="m", params=PoolingParams(task="embed"),
                       inputs=[MediaInput(tuple(parts[:9])), MediaInput(("and", *parts[9:]))])
    assert media_count(call) == 17
    error = await refused(call, LOCAL)
    assert error.message == "the request holds 17 images and audio clips, over this server's " \
                            "--max-images-per-request 16"
    assert images.hits == {}
    assert media_count((await fetch_media(call, MediaLimits(allowed_media_domains=("127.0.0.1",),
                                                            max_images_per_request=17)))) == 17
    assert images.hits == {"img.png": 17}
