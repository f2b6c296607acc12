"""Image and audio parts of every dialect, read into the call's inputs (MediaInput / MediaRef) and their 400s."""
from __future__ import annotations

import base64
import io
import re

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from poolgate.gateway.dialects import cohere, openai, vllm_classify, vllm_pooling
from poolgate.gateway.dialects.cohere_media import image_meta
from poolgate.gateway.dialects.pairs import ContentInput, ImageObject, TextObject, as_input, echo
from poolgate.gateway.dialects.vllm_tokenize import TokenizeRequest
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.score_plan import SideCaps, plan_scores
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.shared.wire.messages import ChatInput, TextPair
from tests.fakes import fake_model

PNG_URL = "data:image/png;base64,iVBORw0KGgo="  # (the dialects do not decode; the plan does)
IMAGE = {"type": "image_url", "image_url": {"url": PNG_URL, "detail": "low"}}
TEXT = {"type": "text", "text": "a cat"}
INFO = fake_model().info


def embeddings(body: dict):
    return openai.to_request(openai.EmbeddingRequest.model_validate(body)).inputs


def image_data_url(fmt: str = "PNG", size=(7, 5), mode: str = "RGB") -> str:
    buf = io.BytesIO()
    Image.new(mode, size, 128).save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(buf.getvalue()).decode()}"


def test_a_conversation_with_an_image_is_one_media_input_with_its_chat():
    messages = [{"role": "system", "content": "embed it"}, {"role": "user", "content": [TEXT, IMAGE]}]
    (x,) = embeddings({"messages": messages})
    assert isinstance(x, MediaInput) and x.role is None
    assert x.parts == ("embed it", "a cat", MediaRef("image", url=PNG_URL))
    assert x.chat == ({"role": "system", "content": "embed it"}, {"role": "user", "content": [TEXT, IMAGE]})


def test_short_forms_audio_and_uuids():
    content = [{"image_url": PNG_URL, "uuid": "img-1"}, {"audio_url": "https://example.com/a.wav"},
               {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "WAV"}},
               {"type": "audio_url", "audio_url": {"url": "data:audio/flac;base64,ZkxhQw=="}}]
    (x,) = embeddings({"input": [{"role": "user", "content": content}]})  # a conversation held in `input`
    assert x.parts == (MediaRef("image", url=PNG_URL, uuid="img-1"),
                       MediaRef("audio", url="https://example.com/a.wav"),
                       MediaRef("audio", url="data:audio/wav;base64,UklGRg==", format="wav"),
                       MediaRef("audio", url="data:audio/flac;base64,ZkxhQw=="))
    assert x.chat is not None
    parts = x.chat[0]["content"]  # the short forms spelled out for a chat template
    assert parts[0] == {"type": "image_url", "image_url": {"url": PNG_URL}, "uuid": "img-1"}
    assert parts[1] == {"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}}


def test_text_only_conversations_stay_chat_inputs_beside_media_ones():
    convos = [[{"role": "user", "content": [TEXT, {"type": "text", "text": "b"}]}],
              [{"role": "user", "content": [IMAGE]}]]
    text, media = embeddings({"messages": convos, "add_generation_prompt": True})
    assert isinstance(text, ChatInput) and text.messages == [{"role": "user", "content": "a cat\nb"}]
    assert text.add_generation_prompt
    assert isinstance(media, MediaInput) and media.parts == (MediaRef("image", url=PNG_URL),)


def test_a_media_model_reads_every_conversation_as_a_media_input():
    info = fake_model().info
    info = type(info)(**{**info.__dict__, "modalities": ("text", "image")})
    req = openai.EmbeddingRequest.model_validate({"messages": [{"role": "user", "content": [TEXT]}]})
    assert openai.to_request(req, "embed", info).inputs == [
        MediaInput(parts=("a cat",), chat=({"role": "user", "content": [TEXT]},))]
    req = vllm_classify.ClassificationRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    assert vllm_classify.to_request(req, info).inputs == [MediaInput(parts=("hi",), chat=({"role": "user",
                                                                                         "content": "hi"},))]
    assert isinstance(vllm_classify.to_request(req, INFO).inputs[0], ChatInput)  # a text model: as before


@pytest.mark.parametrize("module, request_model", [
    (vllm_pooling, vllm_pooling.PoolingRequest), (vllm_classify, vllm_classify.ClassificationRequest)])
def test_pooling_and_classify_read_the_same_parts(module, request_model):
    req = request_model.model_validate({"messages": [{"role": "user", "content": [IMAGE]}]})
    inputs = module.to_request(req, INFO).inputs if module is vllm_pooling else module.to_request(req).inputs
    assert inputs == [MediaInput(parts=(MediaRef("image", url=PNG_URL),), chat=({"role": "user",
                                                                                 "content": [IMAGE]},))]


@pytest.mark.parametrize("part, message", [
    ({"type": "image_embeds", "image_embeds": "AAAA"}, "'image_embeds' parts (precomputed embeddings) are not served"),
    ({"image_embeds": "AAAA"}, "'image_embeds' parts"),
    ({"type": "prompt_embeds"}, "'prompt_embeds' parts"),
    ({"type": "video_url", "video_url": {"url": "x"}}, "video is not served"),
    ({"type": "input_image", "image_url": "x"}, "unknown content part type 'input_image'"),
    ({"text": "no type"}, "Missing 'type' field in multimodal part."),
    ({"type": "image_url"}, "an image_url part needs its URL"),
    ({"type": "image_url", "image_url": {"url": ""}}, "an image_url part needs its URL"),
    ({"type": "input_audio"}, "an input_audio part needs"),
    ({"type": "input_audio", "input_audio": {"data": "x", "format": "wav;base64,AAAA"}}, "is not a format name"),
])
def test_parts_that_are_not_served_are_400s_naming_the_part(part, message):
    with pytest.raises(InvalidRequest, match=re.escape(message)) as err:
        embeddings({"messages": [{"role": "user", "content": [TEXT, part]}]})
    assert err.value.status == 400
    assert "messages[0].content[1]" in err.value.message or "Missing" in err.value.message


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": 5}, {"type": "input_audio", "input_audio": "x"},
                                  {"type": 3}, "image"])
def test_parts_of_the_wrong_type_fail_validation(part):
    with pytest.raises(ValidationError):
        openai.EmbeddingRequest.model_validate({"messages": [{"role": "user", "content": [part]}]})


def test_jina_text_and_image_objects_in_input():
    inputs = embeddings({"input": [{"text": "a cat"}, {"image": "iVBORw0KGgo="}, {"image": PNG_URL}]})
    assert inputs == ["a cat", MediaInput(parts=(MediaRef("image", url="iVBORw0KGgo="),)),
                      MediaInput(parts=(MediaRef("image", url=PNG_URL),))]
    assert embeddings({"input": ["a", "b"]}) == ["a", "b"]  # the other forms as before
    with pytest.raises(ValidationError):
        embeddings({"input": [{"image": 5}]})


def test_tokenize_takes_text_messages_only():
    req = TokenizeRequest.model_validate({"messages": [{"role": "user", "content": [IMAGE]}]})
    with pytest.raises(InvalidRequest, match="an image or audio part is not tokenized here"):
        req.input()


# --- Cohere v2 embed ---------------------------------------------------------------------------------------

def cohere_call(body: dict, info=INFO):
    return cohere.to_request(cohere.CohereEmbedRequest.model_validate(body), info)


def test_cohere_images_are_one_input_each():
    call, texts = cohere_call({"images": [PNG_URL, "iVBORw0KGgo="], "input_type": "image"})
    assert call.inputs == [MediaInput(parts=(MediaRef("image", url=PNG_URL),)),
                           MediaInput(parts=(MediaRef("image", url="iVBORw0KGgo="),))]
    assert texts == []


def test_cohere_v4_inputs_mix_text_and_images_in_one_input_with_its_role():
    body = {"input_type": "search_document", "inputs": [
        {"content": [TEXT, {"type": "image_url", "image_url": {"url": PNG_URL}}, {"type": "text", "text": "b"}]},
        {"content": [TEXT, {"type": "text", "text": "only text"}]}]}
    call, texts = cohere_call(body)
    assert call.inputs == [MediaInput(parts=("a cat", MediaRef("image", url=PNG_URL), "b"), role="document"),
                           "a cat only text"]
    assert texts == ["a cat b", "a cat only text"]


def test_cohere_prompts_prefix_a_media_input():
    info = fake_model().info
    info = type(info)(**{**info.__dict__, "prompts": {"query": "q: "}})
    call, _ = cohere_call({"input_type": "search_query", "inputs": [{"content": [IMAGE]}]}, info)
    assert call.inputs == [MediaInput(parts=("q: ", MediaRef("image", url=PNG_URL)), role="query")]


@pytest.mark.parametrize("body, message", [
    ({"images": [PNG_URL] * 97}, "images: at most 96 per request, got 97"),
    ({"inputs": [{"content": [TEXT]}] * 97}, "inputs: at most 96 per request, got 97"),
    ({"images": [PNG_URL], "texts": ["a"]}, "Exactly one of texts, images, or inputs"),
    ({"inputs": [{"content": [{"type": "audio_url", "audio_url": "x"}]}]}, "take 'text' and 'image_url' parts"),
    ({"inputs": [{"content": [{"type": "image_url"}]}]}, r"inputs\[0\].content\[0\]: an image_url part needs"),
])
def test_cohere_400s(body, message):
    with pytest.raises(InvalidRequest, match=message):
        cohere_call(body)


@pytest.mark.parametrize("fmt, mode, depth", [("PNG", "RGB", 8), ("JPEG", "L", 8), ("GIF", "P", 8),
                                              ("PNG", "I;16", 16), ("WEBP", "RGB", 8)])
def test_cohere_image_meta_reads_the_header(fmt, mode, depth):
    url = image_data_url(fmt, (7, 5), mode)
    assert image_meta(url) == {"width": 7, "height": 5, "format": fmt.lower(), "bit_depth": depth}
    assert image_meta(url.split(",", 1)[1]) == image_meta(url)  # bare base64 too


def test_cohere_image_meta_of_a_large_jpeg_and_of_what_is_not_inline():
    rng = np.random.default_rng(0)
    buf = io.BytesIO()  # a header past the first read (a big EXIF block before the frame)
    Image.fromarray(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(buf, "JPEG", exif=b"Exif\0\0" + b"\0" * 60000)
    assert image_meta(base64.b64encode(buf.getvalue()).decode()) == {"width": 30, "height": 40, "format": "jpeg",
                                                                     "bit_depth": 8}
    assert image_meta("https://example.com/a.png") is None and image_meta("data:image/png;base64,!!") is None


# --- score and rerank --------------------------------------------------------------------------------------

def test_score_inputs_read_as_text_or_media_with_their_role():
    assert as_input("q", "query", "queries[0]") == "q"
    assert as_input(TextObject(text="t"), "document", "documents[0]") == "t"
    text_only = ContentInput.model_validate({"content": [TEXT, {"type": "text", "text": "b"}]})
    assert as_input(text_only, "document", "documents[0]") == "a cat\nb"
    mixed = ContentInput.model_validate({"content": [TEXT, IMAGE]})
    assert as_input(mixed, "document", "documents[0]") == MediaInput(
        parts=("a cat", MediaRef("image", url=PNG_URL)), role="document")
    assert as_input(ImageObject(image="iVBORw0KGgo="), "query", "queries[0]") == MediaInput(
        parts=(MediaRef("image", url="iVBORw0KGgo="),), role="query")
    assert echo(mixed) == {"text": None, "multi_modal": [TEXT, IMAGE]}
    assert echo("d") == {"text": "d", "multi_modal": None}


def test_a_bi_encoder_pools_image_documents_like_texts():
    image = MediaInput(parts=(MediaRef("image", url=PNG_URL),), role="document")
    plan = plan_scores(fake_model(tasks=("embed",)).info, ["q"], [image, "d"])
    assert plan.inputs == ["q", image, "d"] and plan.kind == "bi-encoder"


def test_a_cross_encoders_pair_with_an_image_is_one_media_input_query_last():
    info = fake_model(tasks=("classify",), num_labels=1, dim=1).info
    image = MediaInput(parts=("caption", MediaRef("image", url=PNG_URL)), role="document")
    plan = plan_scores(info, ["q"], [image, "d"])
    assert plan.inputs == [MediaInput(parts=("caption", MediaRef("image", url=PNG_URL), "q"), role="pair"),
                           TextPair("q", "d")]
    query_image = MediaInput(parts=(MediaRef("image", url="q.png"),), role="query")
    plan = plan_scores(info, [query_image], [image, "d"])  # an image query: its one part last
    assert plan.inputs == [MediaInput(parts=("caption", MediaRef("image", url=PNG_URL), MediaRef("image", url="q.png")),
                                      role="pair"),
                           MediaInput(parts=("d", MediaRef("image", url="q.png")), role="pair")]
    with pytest.raises(InvalidRequest, match="one text or one image"):
        plan_scores(info, [MediaInput(parts=("q", MediaRef("image", url=PNG_URL)), role="query")], [image])
    with pytest.raises(InvalidRequest, match="apply to text pairs"):
        plan_scores(info, ["q"], [image], SideCaps(document=4))
    plan = plan_scores(info, ["q"], [image, "d"], instruction="judge")  # for the plan's prompt to place or refuse
    assert plan.inputs == [MediaInput(parts=("caption", MediaRef("image", url=PNG_URL), "q"), role="pair",
                                      chat_template_kwargs={"instruction": "judge"}),
                           TextPair("q", "d", instruction="judge")]
