"""Audio features (shared.inputs.media.audio_features) against transformers' own feature extractors."""
from __future__ import annotations

import numpy as np
import pytest
from transformers import ASTFeatureExtractor, Wav2Vec2FeatureExtractor

from poolgate.shared.inputs.media.audio_features import (
    ast_values,
    conv_frames,
    fbank_frames,
    log_mel_fbank,
    normalized_values,
)


def _clip(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 3100 * t)
            + 0.05 * rng.standard_normal(n)).astype(np.float32)


@pytest.mark.parametrize("do_normalize", [True, False])
@pytest.mark.parametrize("n", [400, 16000, 23457])
def test_wav2vec2_values_equal_the_extractor(n, do_normalize):
    x = _clip(n, seed=n)
    ref = Wav2Vec2FeatureExtractor(do_normalize=do_normalize)(x, sampling_rate=16000, return_tensors="np")
    np.testing.assert_array_equal(normalized_values(x, do_normalize), ref["input_values"][0])


@pytest.mark.filterwarnings("ignore:At least one mel filter")
@pytest.mark.parametrize(("mel", "max_length", "n", "rate"), [
    (128, 1024, 23457, 16000),  # AudioSet's settings: padded
    (16, 64, 23457, 16000),  # cut to max_length
    (40, 100, 400, 16000),  # one frame
    (64, 200, 9000, 8000),  # another rate
])
def test_ast_values_equal_the_extractors_numpy_path(mel, max_length, n, rate):
    x = _clip(n, seed=mel)
    fe = ASTFeatureExtractor(num_mel_bins=mel, max_length=max_length, sampling_rate=rate)
    ref = fe(x, sampling_rate=rate, return_tensors="np")["input_values"][0]
    mine = ast_values(x, mel, rate, max_length, True, fe.mean, fe.std)
    assert mine.shape == ref.shape == (max_length, mel)
    np.testing.assert_allclose(mine, ref, rtol=0, atol=1e-5)
    frames = min(fbank_frames(n), max_length)
    assert log_mel_fbank(x, mel, rate).shape == (fbank_frames(n), mel)
    assert np.all(mine[frames:] == np.float32((0 - fe.mean) / (2 * fe.std)))  # the padding rows


def test_frame_counts():
    assert [fbank_frames(n) for n in (0, 399, 400, 559, 560, 16000)] == [0, 0, 1, 1, 2, 98]
    wav2vec2 = [(10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2)]
    assert conv_frames(16000, wav2vec2) == 49 and conv_frames(400, wav2vec2) == 1 and conv_frames(399, wav2vec2) == 0
