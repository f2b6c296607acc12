"""Audio classifiers' input features from mono samples (numpy only): wav2vec2's values and AST's log-mel fbank.

Both follow the published feature extractors the checkpoints were trained with
(transformers' ``Wav2Vec2FeatureExtractor`` and ``ASTFeatureExtractor``; its
numpy path, which it takes without torchaudio):

- wav2vec2 (and HuBERT, WavLM, SEW, UniSpeech, Data2VecAudio): the raw
  samples, with ``do_normalize`` each clip shifted to zero mean and scaled to
  unit variance (``(x - mean) / sqrt(var + 1e-7)``, in float32);
- AST: Kaldi-style filter-bank features: 25 ms frames (400 samples) every
  10 ms (160), no centring (``1 + (n - 400) // 160`` frames), per frame the
  DC offset removed, pre-emphasis ``y[t] = x[t] - 0.97 x[t-1]`` (the first
  sample scaled by 0.03), a symmetric Hann window, a 512-point FFT's power
  spectrum through ``num_mel_bins`` triangular filters spaced on Kaldi's mel
  scale ``1127 ln(1 + f / 700)`` from 20 Hz to half the sampling rate (the
  triangles drawn in mel space), floored at float32's epsilon and logged;
  then cut or zero-padded to ``max_length`` frames and normalized as
  ``(x - mean) / (2 std)`` with the extractor's AudioSet statistics.
"""

from __future__ import annotations

import numpy as np

FRAME, HOP, FFT = 400, 160, 512  # AST's fbank: samples per frame, between frames, FFT length
PREEMPHASIS = 0.97
MEL_FLOOR = 1.192092955078125e-07  # float32 epsilon
LOW_HZ = 20.0


def normalized_values(samples: np.ndarray, do_normalize: bool) -> np.ndarray:
    """wav2vec2's ``input_values`` of one clip (module doc)."""
    x = np.asarray(samples, dtype=np.float32)
    if not do_normalize:
        return x.copy()
    return ((x - x.mean()) / np.sqrt(x.var() + 1e-7)).astype(np.float32)


def kaldi_mel(hz: float) -> float:
    """Kaldi's mel of ``hz``."""
    return float(1127.0 * np.log(1.0 + hz / 700.0))


def mel_filters(num_mel_bins: int, rate: int) -> np.ndarray:
    """(FFT // 2 + 1, num_mel_bins) triangular filters on Kaldi's mel scale, drawn in mel space (module doc)."""
    edges = np.linspace(kaldi_mel(LOW_HZ), kaldi_mel(rate // 2), num_mel_bins + 2)  # each filter's low, centre, high
    bins = 1127.0 * np.log(1.0 + (rate / FFT) * np.arange(FFT // 2 + 1) / 700.0)  # each FFT bin's mel
    low, centre, high = edges[:-2], edges[1:-1], edges[2:]
    rising = (bins[:, None] - low[None, :]) / (centre - low)[None, :]
    falling = (high[None, :] - bins[:, None]) / (high - centre)[None, :]
    return np.maximum(0.0, np.minimum(rising, falling))


def fbank_frames(samples: int) -> int:
    """How many fbank frames a clip of ``samples`` samples has (0 when shorter than one frame)."""
    return 0 if samples < FRAME else 1 + (samples - FRAME) // HOP


def log_mel_fbank(samples: np.ndarray, num_mel_bins: int, rate: int) -> np.ndarray:
    """(frames, num_mel_bins) float32 log-mel filter-bank energies of one clip (module doc)."""
    x = np.asarray(samples, dtype=np.float64)
    n = fbank_frames(x.size)
    if n == 0:
        return np.zeros((0, num_mel_bins), np.float32)
    frames = np.lib.stride_tricks.sliding_window_view(x, FRAME)[::HOP][:n].copy()  # (n, FRAME)
    frames -= frames.mean(axis=1, keepdims=True)
    frames[:, 1:] -= PREEMPHASIS * frames[:, :-1].copy()
    frames[:, 0] *= 1.0 - PREEMPHASIS
    frames *= np.hanning(FRAME)
    spectrum = np.fft.rfft(frames, n=FFT, axis=1).astype(np.complex64)  # the reference keeps complex64 here
    power = np.abs(spectrum, dtype=np.float64) ** 2  # (n, FFT // 2 + 1)
    mel = np.maximum(MEL_FLOOR, power @ mel_filters(num_mel_bins, rate))
    return np.log(mel).astype(np.float32)


def ast_values(
    samples: np.ndarray, num_mel_bins: int, rate: int, max_length: int, do_normalize: bool, mean: float, std: float
) -> np.ndarray:
    """AST's ``input_values`` of one clip: (max_length, num_mel_bins) float32 (module doc)."""
    needed = FRAME + (max_length - 1) * HOP  # the samples of the first max_length frames (the rest is cut)
    fbank = log_mel_fbank(samples[:needed], num_mel_bins, rate)
    out = np.zeros((max_length, num_mel_bins), np.float32)
    out[: fbank.shape[0]] = fbank
    if do_normalize:
        out = (out - np.float32(mean)) / np.float32(std * 2)
    return out.astype(np.float32)


def conv_frames(samples: int, layers: list[tuple[int, int]]) -> int:
    """Frames a wav2vec2-style convolutional feature encoder makes of ``samples`` samples (kernel, stride) per
    layer, no padding: ``n -> (n - kernel) // stride + 1`` each (0 when too short)."""
    n = samples
    for kernel, stride in layers:
        if n < kernel:
            return 0
        n = (n - kernel) // stride + 1
    return n
