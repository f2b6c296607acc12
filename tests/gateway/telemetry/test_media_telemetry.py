"""Images and audio in the serving path's telemetry: the record's modalities and media count, the span's
``poolgate.input.*`` attributes, ``poolgate_media_items_total``; and the fetch step in the path.

The requests go through the real middleware and ``gateway.serving.serve`` to a real worker (fake text model);
the dialects' parsing of image parts is not this test's: its route builds the ``MediaInput``s itself.
"""
from __future__ import annotations

import base64

from aiohttp import web

from poolgate.gateway.serving import ServeRequest, chars, modalities, serve
from poolgate.gateway.telemetry.record import RequestRecord
from poolgate.gateway.telemetry.tracing import span_attributes
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.telemetry import names
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.shared.wire.messages import ChatInput
from tests.gateway.telemetry.scrape import samples, value

PIXEL = MediaRef("image", url="data:image/png;base64," + base64.b64encode(b"\x89PNG not really").decode())
CLIP = MediaRef("audio", url="data:audio/wav;base64,UklGRg==", format="wav")

CASES = {
    "text": ["plain", MediaInput(("a caption only",))],
    "image": [MediaInput(("look:", PIXEL)), MediaInput((PIXEL,))],
    "audio": [MediaInput((CLIP,))],
    "remote": [MediaInput((MediaRef("image", url="http://127.0.0.1:9/cat.png"),))],
    "many": [MediaInput((PIXEL,) * 17)],
}


async def probe(request: web.Request) -> web.Response:
    inputs = CASES[request.query["case"]]
    served = await serve(request, ServeRequest(None, inputs, PoolingParams(task="embed")))
    return web.json_response({"prompt_tokens": served.result.prompt_tokens})


async def test_media_requests_are_counted_by_kind_and_fetched_before_tokenizing(scraped):
    client = await scraped(routes=[("/v1/probe", probe)])
    ok = await client.get("/v1/probe", params={"case": "text"})
    assert ok.status == 200, await ok.text()
    assert len((await ok.json())["prompt_tokens"]) == 2  # a MediaInput of text is text
    for case, message in [
        ("image", "model 'fake-model' reads text only; an input holds image"),
        ("audio", "model 'fake-model' reads text only; an input holds audio"),
        ("remote", "input[0]: image URLs are not fetched by this server"),
        ("many", "the request holds 17 images and audio clips, over this server's --max-images-per-request 16"),
    ]:
        answer = await client.get("/v1/probe", params={"case": case})
        assert answer.status == 400, case
        assert message in (await answer.json())["error"]["message"], case
    got = await samples(client)
    assert value(got, f"{names.MEDIA_ITEMS}_total", model="fake-model", kind="image") == 2 + 1 + 17
    assert value(got, f"{names.MEDIA_ITEMS}_total", model="fake-model", kind="audio") == 1


def test_modalities_and_counts():
    assert modalities(CASES["text"]) == (("text",), {})
    assert modalities(CASES["image"]) == (("text", "image"), {"image": 2})
    assert modalities([MediaInput((PIXEL, CLIP, PIXEL))]) == (("image", "audio"), {"image": 2, "audio": 1})
    assert modalities([[1, 2, 3], ChatInput(({"role": "user", "content": "hi"},))]) == (("text",), {})


def test_the_span_names_the_modalities_and_the_media_count():
    record = RequestRecord("r", "/v1/embeddings", 0, 0.0, model="m", task="embed", status=200)
    assert names.ATTR_MODALITIES not in span_attributes(record)  # not known (failed before the serving path)
    record.modalities, record.media = modalities(CASES["image"])
    attrs = span_attributes(record)
    assert attrs[names.ATTR_MODALITIES] == "text,image" and attrs[names.ATTR_MEDIA_COUNT] == 2
    record.modalities, record.media = modalities(CASES["text"])
    attrs = span_attributes(record)
    assert attrs[names.ATTR_MODALITIES] == "text" and attrs[names.ATTR_MEDIA_COUNT] == 0
    assert names.ATTR_MODALITIES == "poolgate.input.modalities"


def test_a_media_inputs_characters_are_its_text_parts():
    assert chars(MediaInput(("abc", PIXEL, "de"), role="query")) == 5
    assert chars(MediaInput((PIXEL,))) == 0
