"""Image and audio classifiers over HTTP: a live `poolgate serve` of a tiny random ViT and of a tiny AST, /classify
with vLLM's chat-style `messages` (`image_url` and `input_audio` parts). Probabilities equal transformers' (its
processor or feature extractor, then its forward) at cosine >= 0.9999 in float32; bad images and clips are 400s
naming the input."""
from __future__ import annotations

import base64

import numpy as np
import pytest
import requests
import torch

from poolgate.shared.inputs.media.synthetic import data_url, probe_images, tone_wav
from tests.live_server import live_server
from tests.workers.media import classifiers as tiny

MIN_COSINE = 0.9999


def _classify(url: str, conversations: list) -> requests.Response:
    return requests.post(f"{url}/classify", json={"model": "clf", "messages": conversations}, timeout=60)


def _worst(name: str, data: list[dict], want: np.ndarray) -> None:
    got = np.asarray([d["probs"] for d in data], dtype=np.float32)
    cos = tiny.cosines(got, want)
    print(f"{name}: worst cosine vs transformers {cos.min():.9f}")
    assert cos.min() >= MIN_COSINE, (name, cos)


def _image(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(data)}}


def _audio(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def _user(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": list(parts)}]


def test_image_classifier_over_http(tmp_path):
    folder = tmp_path / "vit"
    model = tiny.vit(folder)
    _, pixels = tiny.image_inputs()
    want = torch.from_numpy(tiny.image_reference(model, folder, pixels)).softmax(-1).numpy()
    images = [data for _, data in probe_images()]
    with live_server(tmp_path, str(folder), "--served-model-name", "clf", "--dtype", "float32") as server:
        one = [_classify(server.url, _user(_image(b))) for b in images]
        assert all(r.status_code == 200 for r in one), [r.text for r in one]
        data = [r.json()["data"][0] for r in one]
        _worst("/classify messages, one image a call", data, want)
        assert [d["label"] for d in data] == [tiny.LABELS[int(i)] for i in want.argmax(1)]
        batch = _classify(server.url, [_user(_image(b)) for b in images])
        assert batch.status_code == 200, batch.text
        _worst("/classify messages, a batch of conversations", batch.json()["data"], want)
        assert batch.json()["usage"]["prompt_tokens"] == len(images) * 17  # (32 / 8)^2 patches + 1 each
        bad = {
            "input[0]: this model reads images, not text": _user({"type": "text", "text": "a cat"}),
            "input[0]: the PNG image is corrupt": _user(
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAAA"}}),
            "input[0]: this model reads images, not audio clips": _user(_audio(tone_wav(0.1))),
        }
        for says, body in bad.items():
            r = _classify(server.url, body)
            assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
        assert "Traceback" not in server.log_text(), server.log_text()[-3000:]


def test_audio_classifier_over_http(tmp_path):
    folder = tmp_path / "ast"
    model = tiny.ast(folder)
    refs = tiny.audio_inputs()
    want = torch.from_numpy(tiny.audio_reference(model, folder, refs)).softmax(-1).numpy()
    with live_server(tmp_path, str(folder), "--served-model-name", "clf", "--dtype", "float32") as server:
        batch = _classify(server.url, [_user(_audio(r.data)) for r in refs])
        assert batch.status_code == 200, batch.text
        _worst("/classify messages with input_audio (WAV, 8-44.1 kHz, mono and stereo)", batch.json()["data"], want)
        soundfile = pytest.importorskip("soundfile")
        import io

        from poolgate.shared.domain.media_limits import MediaLimits
        from poolgate.shared.inputs.media.audio import decode_audio

        flac = io.BytesIO()
        soundfile.write(flac, decode_audio(refs[1], MediaLimits()).samples, 16000, format="FLAC", subtype="PCM_24")
        r = _classify(server.url, _user(_audio(flac.getvalue(), "flac")))
        assert r.status_code == 200, r.text
        assert tiny.cosines(np.asarray([r.json()["data"][0]["probs"]]), want[1:2])[0] >= MIN_COSINE
        bad = {
            "input[0]: unsupported audio format: an MP3 file": _user(_audio(b"ID3" + bytes(64), "mp3")),
            "input[0]: the WAV file is truncated": _user(_audio(tone_wav(0.5)[:-999])),
            "input[0]: this model reads audio clips, not text": _user({"type": "text", "text": "hi"}),
            "input[0]: the clip is too short": _user(_audio(tone_wav(0.01))),
        }
        for says, body in bad.items():
            r = _classify(server.url, body)
            assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
        assert "Traceback" not in server.log_text(), server.log_text()[-3000:]
