"""Audio classifiers through the engine (workers.models.media.audio_classify) against transformers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.inputs.media.synthetic import tone_wav
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.workers.load.weights import CheckpointError
from poolgate.workers.offline import PoolingModel
from tests.workers.media import classifiers as tiny

CLASSIFY, LOGITS = PoolingParams(task="classify"), PoolingParams(task="classify", use_activation=False)
MAKERS = {
    "wav2vec2 group norm (each clip alone)": lambda p: tiny.wav2vec2(p, layer_norm=False),
    "wav2vec2 layer norm (padded with its mask)": lambda p: tiny.wav2vec2(p, layer_norm=True),
    "AST": tiny.ast,
    "Whisper (30 s of log-mel features)": tiny.whisper,
}


@pytest.mark.parametrize("name", list(MAKERS))
def test_probabilities_and_logits_equal_transformers(name, tmp_path):
    model = MAKERS[name](tmp_path)
    refs = tiny.audio_inputs()
    want = tiny.audio_reference(model, tmp_path, refs)
    inputs = [MediaInput((r,)) for r in refs]
    worst = {}
    for dtype in ("float32", "bfloat16"):
        with PoolingModel(str(tmp_path), dtype=dtype) as served:
            assert served.info.modalities == ("audio",) and served.info.tasks == ("classify",)
            probs = served.submit(inputs, CLASSIFY)
            logits = served.submit(inputs, LOGITS).outputs.values
        worst[dtype] = float(tiny.cosines(probs.outputs.values, torch.from_numpy(want).softmax(-1).numpy()).min())
        worst[dtype + " logits"] = float(tiny.cosines(logits, want).min())
        if dtype == "float32":
            np.testing.assert_allclose(logits, want, rtol=1e-4, atol=2e-5)
            assert worst[dtype] >= 0.9999
            if name == "AST":  # (100 - 16) // 10 + 1 = 9 time patches, (32 - 16) // 10 + 1 = 2 mel ones, + 2
                assert probs.prompt_tokens == [9 * 2 + 2] * len(refs)
            elif name.startswith("Whisper"):  # the encoder's positions: 3,000 frames halved by its conv
                assert probs.prompt_tokens == [1500] * len(refs)
            else:  # the conv encoder's frames of the first clip (0.5 s at 16 kHz): 8000 -> 1599 -> 799 -> 399
                assert probs.prompt_tokens[0] == 399
        else:
            assert worst[dtype] >= 0.99
    print(f"{name}: worst cosine probabilities fp32 {worst['float32']:.9f} bf16 {worst['bfloat16']:.9f}; "
          f"logits fp32 {worst['float32 logits']:.9f} bf16 {worst['bfloat16 logits']:.9f}")


def test_bad_clips_are_400s(tmp_path):
    tiny.wav2vec2(tmp_path, layer_norm=False)
    good = MediaInput((MediaRef("audio", data=tone_wav(0.3), format="wav"),))
    bad = {
        "this model reads audio clips, not text": ["hello"],
        "this model reads audio clips, not images": [MediaInput((MediaRef("image", data=b"\x89PNG"),))],
        "the clip is too short: 20 samples at 16000 Hz, this model reads at least 40 (2 ms)": [
            MediaInput((MediaRef("audio", data=tone_wav(20 / 16000), format="wav"),))],
        "unsupported audio format: an MP3 file (declared 'mp3')": [
            MediaInput((MediaRef("audio", data=b"ID3" + bytes(64), format="mp3"),))],
        "the WAV file is truncated": [MediaInput((MediaRef("audio", data=tone_wav(0.3)[:-500], format="wav"),))],
    }
    with PoolingModel(str(tmp_path), dtype="float32", max_model_len=300) as served:
        for says, call in bad.items():
            with pytest.raises(InvalidRequest) as err:
                served.submit([good, *call], CLASSIFY)
            assert "input[1]: " + says in str(err.value), str(err.value)
        with pytest.raises(InvalidRequest, match=r"input\[0\]: the clip is 1.0 s = 799 frames, over this model's "
                                                 r"max_model_len 300 \(0.4 s\)"):
            served.submit([MediaInput((MediaRef("audio", data=tone_wav(1.0), format="wav"),))], CLASSIFY)


def test_an_extractor_poolgate_does_not_compute_is_refused(tmp_path):
    from transformers import SeamlessM4TFeatureExtractor, WhisperFeatureExtractor

    tiny.wav2vec2(tmp_path, layer_norm=False)
    SeamlessM4TFeatureExtractor().save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="feature extractor SeamlessM4TFeatureExtractor is not supported"):
        PoolingModel(str(tmp_path), dtype="float32")
    WhisperFeatureExtractor().save_pretrained(tmp_path)  # one poolgate computes, for a model that reads another input
    with pytest.raises(CheckpointError, match="reads input_values, not the input_features"):
        PoolingModel(str(tmp_path), dtype="float32")


def test_whisper_features_equal_its_extractor():
    """The gateway's numpy log-mel (shared.inputs.media.whisper_features) against WhisperFeatureExtractor (its
    torch STFT path): short, long (cut at 30 s) and 128-bin clips."""
    from transformers import WhisperFeatureExtractor

    from poolgate.shared.inputs.media.whisper_features import slaney_filters, whisper_features

    rng = np.random.default_rng(0)
    for bins, seconds in ((80, 0.5), (80, 7.3), (80, 31.0), (128, 2.0)):
        fe = WhisperFeatureExtractor(feature_size=bins)
        assert np.abs(slaney_filters(400, bins, 16000) - fe.mel_filters).max() < 1e-9
        t = np.arange(int(seconds * 16000)) / 16000
        x = (0.3 * np.sin(2 * np.pi * rng.uniform(100, 3000) * t) + 0.05 * rng.standard_normal(t.size))
        want = fe(x.astype(np.float32), sampling_rate=16000, return_tensors="np")["input_features"][0]
        got = whisper_features(x, bins, 16000, 400, 160, 480000)
        assert got.shape == want.shape == (bins, 3000) and np.abs(got - want).max() < 1e-4


def test_a_partial_checkpoint_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    tiny.ast(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in state.items() if not k.startswith("classifier.")}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"missing tensors \(left random\).*classifier"):
        PoolingModel(str(tmp_path), dtype="float32")
