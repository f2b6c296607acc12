"""Audio clips in (shared.inputs.media.audio): WAV/FLAC decoding, mono mix-down, the guards' 400s; the resampler."""
from __future__ import annotations

import base64
import io
import wave

import numpy as np
import pytest

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.inputs.media.audio import decode_audio, load_clip
from poolgate.shared.inputs.media.resample import resample
from poolgate.shared.inputs.media.synthetic import data_url, tone_wav
from poolgate.shared.wire.media import MediaRef

LIMITS = MediaLimits()


def _wav(samples: np.ndarray, rate: int, width: int) -> bytes:
    """(frames, channels) floats in [-1, 1) as integer PCM WAV bytes, written by hand (not by the decoder's code)."""
    frames, channels = samples.shape
    scale = 2 ** (8 * width - 1)
    ints = np.clip(np.round(samples * scale), -scale, scale - 1).astype(np.int64)
    if width == 1:
        raw = (ints + 128).astype(np.uint8).tobytes()
    else:
        raw = b"".join(int(v).to_bytes(width, "little", signed=True) for v in ints.reshape(-1))
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)
    return out.getvalue()


def _ref(data: bytes, fmt: str | None = "wav") -> MediaRef:
    return MediaRef("audio", url=base64.b64encode(data).decode(), format=fmt)


def _signal(frames: int, channels: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.9, 0.9, (frames, channels))


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_pcm_wav_each_width(width):
    x = _signal(1000, 1)
    clip = decode_audio(_ref(_wav(x, 8000, width)), LIMITS)
    assert clip.rate == 8000 and clip.format == "wav" and clip.samples.dtype == np.float32
    assert np.abs(clip.samples - x[:, 0]).max() <= 1.0 / 2 ** (8 * width - 1) + 1e-7


def test_stereo_is_mixed_to_mono():
    x = _signal(500, 2)
    clip = decode_audio(_ref(_wav(x, 16000, 2)), LIMITS)
    assert clip.channels == 2 and clip.samples.shape == (500,)
    np.testing.assert_allclose(clip.samples, x.mean(axis=1), atol=2 / 32768)


def test_float_wav_and_flac_through_soundfile():
    soundfile = pytest.importorskip("soundfile")
    x = _signal(700, 2, seed=3).astype(np.float32)
    for fmt, subtype in (("WAV", "FLOAT"), ("FLAC", "PCM_24")):
        out = io.BytesIO()
        soundfile.write(out, x, 22050, format=fmt, subtype=subtype)
        clip = decode_audio(_ref(out.getvalue(), fmt.lower()), LIMITS)
        assert clip.rate == 22050 and clip.channels == 2 and clip.format == fmt.lower()
        np.testing.assert_allclose(clip.samples, x.mean(axis=1), atol=2 / 2**23)


def test_data_url_and_resampling_to_the_model_rate():
    clip = load_clip(MediaRef("audio", url=data_url(tone_wav(0.5, 8000), "audio/wav")), LIMITS, 16000)
    assert clip.rate == 16000 and clip.samples.size == 8000


def _truncated_flac() -> bytes:
    soundfile = pytest.importorskip("soundfile")
    out = io.BytesIO()
    soundfile.write(out, _signal(20000, 1), 16000, format="FLAC")
    return out.getvalue()[: len(out.getvalue()) // 2]


BAD = [  # (what, bytes or a callable making them, declared format, limits, the 400 says)
    ("MP3 bytes", b"ID3\x03\x00" + bytes(100), "mp3", LIMITS, "unsupported audio format: an MP3 file (declared 'mp3')"),
    ("Ogg bytes", b"OggS" + bytes(100), None, LIMITS, "unsupported audio format: an Ogg file"),
    ("a PNG", b"\x89PNG\r\n\x1a\n" + bytes(50), "wav", LIMITS, "not a WAV or FLAC file (declared 'wav')"),
    ("truncated WAV", tone_wav(0.2)[:-1000], "wav", LIMITS, "the WAV file is truncated"),
    ("WAV header only", tone_wav(0.2)[:30], "wav", LIMITS, "WAV"),
    ("empty WAV", _wav(np.zeros((0, 1)), 16000, 2), "wav", LIMITS, "the audio is empty"),
    ("too long", tone_wav(2.0), "wav", MediaLimits(max_audio_seconds=1.5), "over this server's --max-audio-seconds 1.5"),
    ("too many bytes", tone_wav(1.0), "wav", MediaLimits(max_media_bytes=1000), "over this server's 1,000"),
    ("truncated FLAC", _truncated_flac, "flac", LIMITS, "FLAC file is truncated"),
    ("corrupt FLAC", b"fLaC" + bytes(200), "flac", LIMITS, "FLAC file is truncated or corrupt"),
]


@pytest.mark.parametrize(("what", "data", "fmt", "limits", "says"), BAD, ids=[b[0] for b in BAD])
def test_bad_audio_is_a_400(what, data, fmt, limits, says):
    data = data() if callable(data) else data
    with pytest.raises(InvalidRequest) as err:
        decode_audio(_ref(data, fmt), limits, "input[0]")
    assert err.value.status == 400 and says in str(err.value) and str(err.value).startswith("input[0]: ")
    assert "<" not in str(err.value) and "()" not in str(err.value)  # no object reprs, no empty reason


def test_bad_base64_is_a_400():
    with pytest.raises(InvalidRequest, match="not valid base64"):
        decode_audio(MediaRef("audio", url="%%%not base64", format="wav"), LIMITS)


@pytest.mark.parametrize(("a", "b"), [(44100, 16000), (48000, 16000), (8000, 16000), (22050, 16000), (16000, 8000)])
def test_resampler_keeps_a_tone_and_removes_what_is_past_the_new_nyquist(a, b):
    t = np.arange(int(a * 0.5)) / a
    tone = resample(np.sin(2 * np.pi * 440 * t), a, b)
    assert tone.size == -(-t.size * b // a)
    want = np.sin(2 * np.pi * 440 * np.arange(tone.size) / b)
    inner = slice(b // 20, -b // 20)  # away from the edges, where the filter sees zeros
    assert np.abs(tone[inner] - want[inner]).max() < 2e-3
    if b < a:  # a tone at 0.45 of the old rate is above the new Nyquist frequency: filtered out (< -40 dB)
        alias = resample(np.sin(2 * np.pi * 0.45 * a * t), a, b)
        assert np.sqrt(np.mean(alias[inner] ** 2)) < 0.01 * np.sqrt(0.5)


def test_resampler_equals_scipy_resample_poly():
    signal = pytest.importorskip("scipy.signal")
    x = np.random.default_rng(1).standard_normal(12345)
    for a, b, up, down in ((44100, 16000, 160, 441), (48000, 16000, 1, 3), (8000, 16000, 2, 1)):
        np.testing.assert_allclose(resample(x, a, b), signal.resample_poly(x, up, down), atol=5e-7)
