"""Whisper's log-mel ``input_features`` of one clip (numpy only), as transformers' ``WhisperFeatureExtractor`` makes
them for a Whisper audio classifier.

The clip (mono, at the extractor's rate) is cut or zero-padded to
``chunk_length`` seconds (30: ``n_samples``), then, as ``torch.stft`` with its
defaults does it: reflect-padded by ``n_fft // 2`` at both ends, framed every
``hop_length`` samples with a periodic Hann window of ``n_fft``, and each
frame's one-sided power spectrum taken; the last frame is dropped
(``n_samples // hop_length`` frames). The power goes through ``feature_size``
triangular filters on the Slaney mel scale (linear below 1 kHz, logarithmic
above) from 0 to 8 kHz, each scaled to unit area (Slaney's normalisation),
floored at 1e-10 and ``log10``-ed; values below the clip's maximum minus 8 are
raised to it, then ``(x + 4) / 4``. Result: ``(feature_size, frames)`` float32.
"""

from __future__ import annotations

import numpy as np

MAX_HZ = 8000.0
MEL_FLOOR = 1e-10
BREAK_HZ, BREAK_MEL = 1000.0, 15.0  # the Slaney scale: 3 mels per 200 Hz up to 1 kHz, logarithmic after
LOG_STEP = np.log(6.4) / 27.0


def slaney_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    return np.where(hz < BREAK_HZ, 3.0 * hz / 200.0, BREAK_MEL + np.log(np.maximum(hz, 1e-12) / BREAK_HZ) / LOG_STEP)


def slaney_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    return np.where(mel < BREAK_MEL, 200.0 * mel / 3.0, BREAK_HZ * np.exp(LOG_STEP * (mel - BREAK_MEL)))


def slaney_filters(n_fft: int, feature_size: int, rate: int) -> np.ndarray:
    """(n_fft // 2 + 1, feature_size) triangular filters, each over its neighbours' centres in Hz, scaled by
    2 / (its width in Hz)."""
    edges = slaney_hz(np.linspace(slaney_mel(np.array(0.0)), slaney_mel(np.array(MAX_HZ)), feature_size + 2))
    bins = np.linspace(0.0, rate // 2, n_fft // 2 + 1)
    low, centre, high = edges[:-2], edges[1:-1], edges[2:]
    rising = (bins[:, None] - low[None, :]) / (centre - low)[None, :]
    falling = (high[None, :] - bins[:, None]) / (high - centre)[None, :]
    return np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (high - low))[None, :]


def whisper_features(
    samples: np.ndarray, feature_size: int, rate: int, n_fft: int, hop: int, n_samples: int
) -> np.ndarray:
    """(feature_size, n_samples // hop) float32 log-mel features of one clip (module doc)."""
    x = np.zeros(n_samples, dtype=np.float32)
    clip = np.asarray(samples, dtype=np.float32)[:n_samples]
    x[: clip.size] = clip
    padded = np.pad(x, n_fft // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop][: n_samples // hop]
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2  # (frames, n_fft // 2 + 1)
    mel = power @ slaney_filters(n_fft, feature_size, rate)  # (frames, feature_size)
    log = np.log10(np.maximum(mel, MEL_FLOOR))
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).T.astype(np.float32)
