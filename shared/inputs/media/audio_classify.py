"""The ``audio_classify`` plan: one clip per input, as wav2vec2-style or AST classifiers read it.

Settings (``workers.models.media.audio_classify`` writes them at load):
``extractor`` (``wav2vec2``, ``ast`` or ``whisper``), ``sampling_rate``, ``do_normalize``;
for wav2vec2 ``conv`` (the feature encoder's (kernel, stride) per layer); for
AST ``num_mel_bins``, ``max_length``, ``mean``, ``std`` and ``tokens``; for
Whisper ``feature_size``, ``n_fft``, ``hop_length``, ``n_samples`` and ``tokens``. Each
input is one clip (``shared.inputs.media.single``: text is a 400), decoded,
mixed to mono and resampled (``shared.inputs.media.audio``), then turned into
``input_values`` (``shared.inputs.media.audio_features``): wav2vec2's
``(samples,)``, AST's ``(max_length, num_mel_bins)``; or Whisper's
``input_features`` (``shared.inputs.media.whisper_features``): ``(feature_size,
n_samples // hop_length)``, the clip cut or padded to 30 s as its extractor does.

A clip's cost in the token budget is the length of the sequence the model's
transformer reads: for wav2vec2 the feature encoder's frames
(``n -> (n - kernel) // stride + 1`` per conv layer: 49 a second at 16 kHz
for the usual 7 layers), for AST its fixed patch count
(``f * t + 2``, whatever the clip's length: the features are padded to
``max_length`` frames), for Whisper its encoder's positions
(``max_source_positions``, 1,500: every clip is 30 s of features). A clip too short for one frame, or one with more
frames than the model's ``max_model_len``, is a 400.
"""

from __future__ import annotations

import json
from typing import Any

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.inputs.encoded import Encoded, TextEncoder
from poolgate.shared.inputs.media.audio import load_clip
from poolgate.shared.inputs.media.audio_features import FRAME, ast_values, conv_frames, normalized_values
from poolgate.shared.inputs.media.single import one_item_per_input, single_media
from poolgate.shared.inputs.media.whisper_features import whisper_features
from poolgate.shared.wire.media import AUDIO, MediaItem, MediaRef, digest_of
from poolgate.shared.wire.messages import ModelInfo, PoolingCall

EXTRACTORS = ("wav2vec2", "ast", "whisper")


class AudioClassifyPlan:
    """One clip per input (module doc)."""

    def __init__(self, info: ModelInfo, encoder: TextEncoder, settings: dict[str, Any]):
        if settings.get("extractor") not in EXTRACTORS:
            raise ValueError(f"audio_classify: extractor {settings.get('extractor')!r}, not one of {EXTRACTORS}")
        self.settings = {k: v for k, v in settings.items() if k != "plan"}
        self.rate = int(settings["sampling_rate"])
        self.max_len = info.max_model_len
        self.key = json.dumps(self.settings, sort_keys=True)

    def encode(self, call: PoolingCall, limits: MediaLimits) -> Encoded:
        return one_item_per_input(single_media(call.inputs, AUDIO), lambda where, ref: self.item(ref, limits, where))

    def item(self, ref: MediaRef, limits: MediaLimits, where: str) -> MediaItem:
        """One clip, decoded, resampled and featurized."""
        clip = load_clip(ref, limits, self.rate, where)
        s, n = self.settings, clip.samples.size
        if s["extractor"] == "ast":
            if n < FRAME:
                raise self._short(where, n, FRAME)
            values = ast_values(
                clip.samples,
                int(s["num_mel_bins"]),
                self.rate,
                int(s["max_length"]),
                bool(s["do_normalize"]),
                float(s["mean"]),
                float(s["std"]),
            )
            tokens = int(s["tokens"])
        elif s["extractor"] == "whisper":  # always chunk_length seconds of features: the clip cut or padded
            n_fft, hop = int(s["n_fft"]), int(s["hop_length"])
            values = whisper_features(clip.samples, int(s["feature_size"]), self.rate, n_fft, hop, int(s["n_samples"]))
            tokens = int(s["tokens"])
        else:
            layers = [(int(k), int(st)) for k, st in s["conv"]]
            tokens = conv_frames(n, layers)
            if tokens == 0:
                raise self._short(where, n, shortest(layers))
            if tokens > self.max_len:
                raise InvalidRequest(
                    f"{where}: the clip is {clip.seconds:.1f} s = {tokens:,} frames, over this model's "
                    f"max_model_len {self.max_len:,} ({self.max_len / tokens * clip.seconds:.1f} s); send a shorter "
                    "clip or serve the model with a larger --max-model-len",
                    param=where,
                )
            values = normalized_values(clip.samples, bool(s["do_normalize"]))
        meta = {
            "seconds": round(clip.seconds, 3),
            "format": clip.format,
            "channels": clip.channels,
            "sampling_rate": self.rate,
        }
        name = "input_features" if s["extractor"] == "whisper" else "input_values"
        return MediaItem(AUDIO, {name: values}, digest_of(AUDIO, clip.samples, self.key), tokens, meta)

    def _short(self, where: str, n: int, need: int) -> InvalidRequest:
        return InvalidRequest(
            f"{where}: the clip is too short: {n} samples at {self.rate} Hz, this model reads at least {need} "
            f"({need / self.rate * 1000:.0f} ms)",
            param=where,
        )


def shortest(layers: list[tuple[int, int]]) -> int:
    """The fewest samples that give one frame through ``layers``."""
    n = 1
    for kernel, stride in reversed(layers):
        n = (n - 1) * stride + kernel
    return n
