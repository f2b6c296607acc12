"""Tiny random image and audio classifiers saved with their processors, and transformers' answers for them."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from poolgate.shared.domain.media_limits import MediaLimits
from poolgate.shared.inputs.media.audio import load_clip
from poolgate.shared.inputs.media.images import decode_image
from poolgate.shared.inputs.media.synthetic import probe_images
from poolgate.shared.wire.media import MediaInput, MediaRef

LABELS = {0: "cat", 1: "dog", 2: "bird"}
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}


def _named(n: int) -> dict:
    id2label = LABELS if n == 3 else {i: f"class {i}" for i in range(n)}
    return {"num_labels": n, "id2label": id2label, "label2id": {v: k for k, v in id2label.items()}}


def _save(model, processor, folder: Path) -> torch.nn.Module:
    model.eval().save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)
    return model


def vit(folder: Path, **config) -> torch.nn.Module:
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessorPil

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=32, patch_size=8, **SMALL, **_named(3), **config)
    return _save(ViTForImageClassification(cfg), ViTImageProcessorPil(size={"height": 32, "width": 32}), folder)


def deit(folder: Path) -> torch.nn.Module:
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher, DeiTImageProcessorPil

    torch.manual_seed(1)
    cfg = DeiTConfig(image_size=32, patch_size=8, **SMALL, **_named(4))
    proc = DeiTImageProcessorPil(size={"height": 40, "width": 40}, crop_size={"height": 32, "width": 32})
    return _save(DeiTForImageClassificationWithTeacher(cfg), proc, folder)


def convnext(folder: Path) -> torch.nn.Module:
    from transformers import ConvNextConfig, ConvNextForImageClassification, ConvNextImageProcessorPil

    torch.manual_seed(2)
    cfg = ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, **_named(5))
    return _save(ConvNextForImageClassification(cfg), ConvNextImageProcessorPil(size={"shortest_edge": 48}), folder)


def clip(folder: Path) -> torch.nn.Module:
    from transformers import CLIPConfig, CLIPForImageClassification, CLIPImageProcessorPil

    torch.manual_seed(6)
    vision = {**SMALL, "image_size": 32, "patch_size": 8, "projection_dim": 16}
    cfg = CLIPConfig(vision_config=vision, text_config={**SMALL, "vocab_size": 99}, **_named(3))
    proc = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return _save(CLIPForImageClassification(cfg), proc, folder)


def wav2vec2(folder: Path, *, layer_norm: bool) -> torch.nn.Module:
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification

    torch.manual_seed(3)
    cfg = Wav2Vec2Config(**SMALL, conv_dim=(16, 16, 16), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2, classifier_proj_size=16,
                         feat_extract_norm="layer" if layer_norm else "group", do_stable_layer_norm=layer_norm,
                         vocab_size=10, **_named(4))
    extractor = Wav2Vec2FeatureExtractor(return_attention_mask=layer_norm, do_normalize=True)
    return _save(Wav2Vec2ForSequenceClassification(cfg), extractor, folder)


def ast(folder: Path) -> torch.nn.Module:
    from transformers import ASTConfig, ASTFeatureExtractor, ASTForAudioClassification

    torch.manual_seed(4)
    cfg = ASTConfig(**SMALL, patch_size=16, frequency_stride=10, time_stride=10, max_length=100, num_mel_bins=32,
                    **_named(3))
    return _save(ASTForAudioClassification(cfg), ASTFeatureExtractor(num_mel_bins=32, max_length=100), folder)


def whisper(folder: Path) -> torch.nn.Module:
    """A 2-layer Whisper encoder (d_model 32, 80 mel bins, 1,500 positions: 30 s) with a 3-label head."""
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForAudioClassification

    torch.manual_seed(0)
    cfg = WhisperConfig(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, decoder_layers=1,
                        decoder_attention_heads=4, decoder_ffn_dim=64, num_mel_bins=80, max_source_positions=1500,
                        vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3,
                        classifier_proj_size=16, **_named(3))
    return _save(WhisperForAudioClassification(cfg), WhisperFeatureExtractor(), folder)


def image_inputs() -> tuple[list[MediaInput], list[np.ndarray]]:
    """The probe images as inputs, and each one's RGB pixels as the gateway decodes them."""
    refs = [MediaRef("image", data=data) for _, data in probe_images()]
    return [MediaInput((r,)) for r in refs], [decode_image(r, MediaLimits()).pixels for r in refs]


def image_reference(model: torch.nn.Module, folder: Path, pixels: list[np.ndarray]) -> np.ndarray:
    """transformers' logits: its processor (from the folder) over the decoded pixels, then its forward."""
    from PIL import Image
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(str(folder))
    batch = proc([Image.fromarray(p) for p in pixels], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return model(pixel_values=batch).logits.numpy()


def wav(samples: np.ndarray, rate: int) -> bytes:
    """(frames, channels) floats as a 16-bit WAV."""
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def audio_inputs() -> list[MediaRef]:
    """Clips of several lengths, rates and channel counts."""
    rng = np.random.default_rng(5)
    out = []
    for seconds, rate, channels in ((0.5, 16000, 1), (1.3, 16000, 1), (0.8, 8000, 2), (0.4, 44100, 1), (2.0, 22050, 2)):
        t = np.arange(int(seconds * rate)) / rate
        tone = 0.3 * np.sin(2 * np.pi * rng.uniform(200, 2000) * t)[:, None] + 0.05 * rng.standard_normal(
            (t.size, channels))
        out.append(MediaRef("audio", data=wav(tone, rate), format="wav"))
    return out


def audio_reference(model: torch.nn.Module, folder: Path, refs: list[MediaRef]) -> np.ndarray:
    """transformers' logits, one clip at a time: its extractor over the gateway's decoded, resampled samples."""
    from transformers import AutoFeatureExtractor

    fe = AutoFeatureExtractor.from_pretrained(str(folder))
    rows = []
    for ref in refs:
        samples = load_clip(ref, MediaLimits(), fe.sampling_rate).samples
        inputs = fe(samples, sampling_rate=fe.sampling_rate, return_tensors="pt")
        with torch.no_grad():
            rows.append(model(**inputs).logits[0].numpy())
    return np.stack(rows)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
