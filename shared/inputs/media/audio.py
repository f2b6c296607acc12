"""An audio reference (``shared.wire.media.MediaRef``) to mono float samples at the model's rate, with guards.

``decode_audio`` reads the clip's bytes as images are read (a ``data:`` URL,
bare base64 as OpenAI's ``input_audio.data`` carries it, or fetched bytes;
``shared.inputs.media.images.media_bytes``: the byte cap), tells the format
by its first bytes (the declared ``format`` only names what was sent when the
bytes are no clip at all) and decodes:

- WAV with the standard library's ``wave``: integer PCM of 8 (unsigned), 16,
  24 or 32 bits, scaled to [-1, 1); float WAV and WAVE_FORMAT_EXTENSIBLE
  files go to soundfile;
- FLAC with soundfile (libsndfile); where soundfile is not installed, FLAC is
  refused with a 400 that says so.

Every header is read first and the clip refused before its samples are
decoded when it is longer than ``max_audio_seconds`` or has no samples; a
truncated or corrupt file is a 400 (never a partial clip); so is any other
format (MP3, Ogg, M4A...). Channels are averaged to mono. ``load_clip`` then
resamples to the model's rate (``shared.inputs.media.resample``).
"""

from __future__ import annotations

import io
import re
import wave
from dataclasses import dataclass

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.inputs.media.images import media_bytes
from poolgate.shared.inputs.media.resample import resample
from poolgate.shared.wire.media import MediaRef

FORMATS = ("wav", "flac")
MAX_CHANNELS = 32
MAX_RATE = 768_000
# first bytes of formats clients send that this server does not decode, for the 400
OTHER_FORMATS = (
    (b"ID3", "MP3"),
    (b"\xff\xfb", "MP3"),
    (b"\xff\xf3", "MP3"),
    (b"\xff\xf2", "MP3"),
    (b"OggS", "Ogg"),
    (b"\x1aE\xdf\xa3", "WebM/Matroska"),
    (b"FORM", "AIFF"),
    (b"#!AMR", "AMR"),
)


@dataclass(frozen=True)
class DecodedAudio:
    """A clip's mono float32 samples at ``rate`` and what it was."""

    samples: np.ndarray
    rate: int
    format: str
    channels: int

    @property
    def seconds(self) -> float:
        return self.samples.size / self.rate


def audio_format(data: bytes) -> str | None:
    """``wav``, ``flac``, the name of another known format, or None."""
    if data[:4] in (b"RIFF", b"RIFX") and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    for magic, name in OTHER_FORMATS:
        if data.startswith(magic):
            return name
    if data[4:8] == b"ftyp":
        return "MP4/M4A"
    return None


def decode_audio(ref: MediaRef, limits: MediaLimits, where: str = "audio") -> DecodedAudio:
    """``ref`` as mono samples at its own rate (module doc); ``where`` names it in the 400."""
    data = media_bytes(ref, limits, where)
    fmt = audio_format(data)
    if fmt not in FORMATS:
        said = f" (declared {ref.format!r})" if ref.format else ""
        what = f"{'an' if fmt[0] in 'AEIMO' else 'a'} {fmt} file" if fmt else "not a WAV or FLAC file"
        raise InvalidRequest(f"{where}: unsupported audio format: {what}{said}; send WAV or FLAC", param=where)
    if fmt == "wav" and data[:4] == b"RIFF":
        try:
            return _wav(data, limits, where)
        except _NotPcm:
            pass  # float or extensible WAV: soundfile reads it
    return _soundfile(data, fmt, limits, where)


def load_clip(ref: MediaRef, limits: MediaLimits, rate: int, where: str = "audio") -> DecodedAudio:
    """``ref`` decoded, mono, resampled to ``rate``."""
    clip = decode_audio(ref, limits, where)
    if clip.rate == rate:
        return clip
    return DecodedAudio(resample(clip.samples, clip.rate, rate), rate, clip.format, clip.channels)


class _NotPcm(Exception):
    """A WAV that ``wave`` does not read (float samples, WAVE_FORMAT_EXTENSIBLE)."""


def _check_header(frames: int, rate: int, channels: int, limits: MediaLimits, where: str, fmt: str) -> None:
    if not 0 < rate <= MAX_RATE:
        raise InvalidRequest(f"{where}: the {fmt} header gives a sample rate of {rate} Hz", param=where)
    if not 0 < channels <= MAX_CHANNELS:
        raise InvalidRequest(f"{where}: the {fmt} header gives {channels} channels", param=where)
    if frames <= 0:
        raise InvalidRequest(f"{where}: the audio is empty (no samples)", param=where)
    seconds = frames / rate
    if seconds > limits.max_audio_seconds:
        raise InvalidRequest(
            f"{where}: the clip is {seconds:,.1f} s long, over this server's --max-audio-seconds "
            f"{limits.max_audio_seconds:g}",
            param=where,
        )


def _wav(data: bytes, limits: MediaLimits, where: str) -> DecodedAudio:
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            channels, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            _check_header(frames, rate, channels, limits, where, "WAV")
            if width not in (1, 2, 3, 4):
                raise InvalidRequest(f"{where}: WAV samples of {8 * width} bits are not supported", param=where)
            raw = w.readframes(frames)
    except wave.Error as exc:
        if "unknown format" in str(exc):
            raise _NotPcm from None
        raise InvalidRequest(f"{where}: not a WAV file this server can read{_why(exc)}", param=where) from None
    except (EOFError, ValueError) as exc:
        raise InvalidRequest(f"{where}: the WAV file is truncated or corrupt{_why(exc)}", param=where) from None
    if len(raw) != frames * channels * width:
        raise InvalidRequest(
            f"{where}: the WAV file is truncated: its header gives {frames:,} frames, its data holds "
            f"{len(raw) // (channels * width):,}",
            param=where,
        )
    return DecodedAudio(_mono(_pcm(raw, width).reshape(frames, channels)), rate, "wav", channels)


def _why(exc: Exception) -> str:
    """The decoder's reason in parentheses (libsndfile's without its "Error opening <object>:" prefix), or ""."""
    text = re.sub(r"^Error opening .*?>: (Error : )?", "", str(exc)).strip()
    return f" ({text})" if text else ""


def _pcm(raw: bytes, width: int) -> np.ndarray:
    """Little-endian integer PCM as float32 in [-1, 1)."""
    if width == 1:  # 8-bit WAV is unsigned
        return ((np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0).astype(np.float32)
    if width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        ints = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        ints = np.where(ints >= 1 << 23, ints - (1 << 24), ints)
        return (ints.astype(np.float64) / (1 << 23)).astype(np.float32)
    ints = np.frombuffer(raw, "<i2" if width == 2 else "<i4")
    return (ints.astype(np.float64) / (1 << (8 * width - 1))).astype(np.float32)


def _mono(samples: np.ndarray) -> np.ndarray:
    """(frames, channels) → (frames,) float32, the channels' mean."""
    if samples.shape[1] == 1:
        return np.ascontiguousarray(samples[:, 0], dtype=np.float32)
    return samples.astype(np.float64).mean(axis=1).astype(np.float32)


def _soundfile(data: bytes, fmt: str, limits: MediaLimits, where: str) -> DecodedAudio:
    try:
        import soundfile
    except ImportError:  # pragma: no cover (soundfile is a dependency; a stripped install may lack it)
        raise InvalidRequest(
            f"{where}: {fmt.upper()} audio needs the soundfile package, which this server lacks; send 16-bit PCM WAV",
            param=where,
        ) from None
    name = fmt.upper()
    try:
        info = soundfile.info(io.BytesIO(data))
        _check_header(int(info.frames), int(info.samplerate), int(info.channels), limits, where, name)
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except InvalidRequest:
        raise
    except Exception as exc:  # libsndfile's errors (soundfile.LibsndfileError, RuntimeError, ...)
        raise InvalidRequest(f"{where}: the {name} file is truncated or corrupt{_why(exc)}", param=where) from None
    if samples.shape[0] != info.frames:
        raise InvalidRequest(
            f"{where}: the {name} file is truncated: its header gives {info.frames:,} frames, its data holds "
            f"{samples.shape[0]:,}",
            param=where,
        )
    if not np.isfinite(samples).all():
        raise InvalidRequest(f"{where}: the {name} file holds samples that are not finite numbers", param=where)
    return DecodedAudio(_mono(samples), int(rate), fmt, int(info.channels))
