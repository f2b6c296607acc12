"""Audio classifiers (wav2vec2-style ``*ForSequenceClassification``, ``ASTForAudioClassification`` and
``WhisperForAudioClassification``), padded.

The model is transformers' own class, loaded whole or refused
(``workers.models.media.classifier``); it reads ``input_values`` made by the
gateway's ``audio_classify`` plan with the folder's feature extractor's
settings, which must be ``Wav2Vec2FeatureExtractor``'s (wav2vec2, HuBERT,
WavLM, SEW, SEW-D, UniSpeech, UniSpeechSat, Data2VecAudio, Wav2Vec2-Conformer)
or ``ASTFeatureExtractor``'s, or a Whisper encoder's ``input_features`` from
``WhisperFeatureExtractor``'s settings (30 s of log-mel frames, a batch
stacked); any other extractor, or a model whose forward reads something else
(Wav2Vec2-BERT's ``input_features``), is refused at load.

AST's features are all ``max_length`` frames long: a batch is stacked and run
at once. wav2vec2's clips differ in length: where the extractor returns an
attention mask (``feat_extract_norm == "layer"`` checkpoints) a batch is
zero-padded and run at once with its mask; where it does not (the
group-norm checkpoints, trained without one, whose output padding would
change) each clip runs alone. Each clip's logits land in its sequence's last
row, pooled by the classify head with the config's activation and labels.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from poolgate.shared.inputs.media.audio_features import conv_frames
from poolgate.workers.batch.packing import PackedBatch
from poolgate.workers.load.weights import CheckpointError
from poolgate.workers.models.media import MediaBuilt, MediaFamily, MediaSource
from poolgate.workers.models.media.classifier import LogitsInLastRow, classify_pooler, no_text_files
from poolgate.workers.models.media.loading import load_whole
from poolgate.workers.pooling.classify import labels_of

EXTRACTORS = {"Wav2Vec2FeatureExtractor": "wav2vec2", "ASTFeatureExtractor": "ast",
              "WhisperFeatureExtractor": "whisper"}
INPUTS = {"wav2vec2": "input_values", "ast": "input_values", "whisper": "input_features"}  # what each model reads
DEFAULT_MAX_SECONDS = 60  # wav2vec2's max_model_len without --max-model-len: a minute of frames


def extractor_settings(path: Any) -> dict[str, Any]:
    """The folder's feature extractor as the plan's settings (module doc); CheckpointError for another."""
    where = path / "preprocessor_config.json"
    if not where.is_file():
        raise CheckpointError(path, "no preprocessor_config.json: an audio classifier is served with its own "
                                    "feature extractor's settings")
    config = json.loads(where.read_text())
    name = config.get("feature_extractor_type")
    if name not in EXTRACTORS:
        raise CheckpointError(where, f"feature extractor {name} is not supported (poolgate computes the features of "
                                     f"{', '.join(EXTRACTORS)})")
    from transformers import AutoFeatureExtractor

    fe = AutoFeatureExtractor.from_pretrained(str(path))
    settings = {"plan": "audio_classify", "extractor": EXTRACTORS[name], "sampling_rate": int(fe.sampling_rate),
                "do_normalize": bool(getattr(fe, "do_normalize", False))}
    if name == "ASTFeatureExtractor":
        return {**settings, "num_mel_bins": int(fe.num_mel_bins), "max_length": int(fe.max_length),
                "mean": float(fe.mean), "std": float(fe.std)}
    if name == "WhisperFeatureExtractor":  # 30 s of log-mel features whatever the clip (no normalisation, no mask)
        if getattr(fe, "dither", 0.0) or getattr(fe, "padding_value", 0.0):
            raise CheckpointError(where, "a Whisper extractor with dither or a padding_value: poolgate computes "
                                         "its features without noise and pads with zeros")
        return {**settings, "do_normalize": False, "feature_size": int(fe.feature_size), "n_fft": int(fe.n_fft),
                "hop_length": int(fe.hop_length), "n_samples": int(fe.n_samples)}
    if getattr(fe, "padding_value", 0.0) != 0.0:
        raise CheckpointError(where, f"padding_value {fe.padding_value}: poolgate pads wav2vec2 clips with zeros")
    return {**settings, "attention_mask": bool(fe.return_attention_mask)}


class AudioClassifier(LogitsInLastRow):
    """A batch of clips through the model (module doc); logits in each sequence's last row."""

    def __init__(self, model: torch.nn.Module, num_labels: int, *, stacked: bool, masked: bool, reads: str):
        super().__init__(model, num_labels)
        self.stacked, self.masked, self.reads = stacked, masked, reads  # reads: input_values or input_features

    def logits(self, batch: PackedBatch) -> torch.Tensor:
        media = batch.media or []
        if len(media) != len(batch.lengths) or any(m is None or len(m) != 1 for m in media):
            raise ValueError("an audio classifier reads one clip per sequence")
        device, dtype = self.device_dtype()
        clips = [m[0].arrays[self.reads] for m in media]
        if self.stacked:  # AST: all max_length frames; Whisper: all 30 s of features
            return self.model(**{self.reads: torch.from_numpy(np.stack(clips)).to(device, dtype)}).logits
        if not self.masked:  # trained without a mask: each clip alone
            return torch.cat([self.model(input_values=torch.from_numpy(c)[None].to(device, dtype)).logits
                              for c in clips])
        width = max(c.size for c in clips)
        values = np.zeros((len(clips), width), np.float32)
        mask = np.zeros((len(clips), width), np.int64)
        for i, c in enumerate(clips):
            values[i, : c.size], mask[i, : c.size] = c, 1
        return self.model(input_values=torch.from_numpy(values).to(device, dtype),
                          attention_mask=torch.from_numpy(mask).to(device)).logits


def build(source: MediaSource) -> MediaBuilt:
    settings = extractor_settings(source.path)
    model = load_whole(source)
    reads = INPUTS[settings["extractor"]]
    if model.main_input_name != reads:
        raise CheckpointError(source.path / "config.json", f"{source.architecture} reads {model.main_input_name}, "
                              f"not the {reads} its feature extractor makes")
    hf = json.loads(model.config.to_json_string())
    if settings["extractor"] == "ast":
        patch = int(hf.get("patch_size", 16))
        f = (settings["num_mel_bins"] - patch) // int(hf["frequency_stride"]) + 1
        t = (settings["max_length"] - patch) // int(hf["time_stride"]) + 1
        settings["tokens"] = max_len = f * t + 2
        if hf.get("num_mel_bins") != settings["num_mel_bins"] or hf.get("max_length") != settings["max_length"]:
            raise CheckpointError(source.path, "the feature extractor's num_mel_bins/max_length differ from "
                                               "config.json's")
    elif settings["extractor"] == "whisper":  # the encoder's positions: the features' frames halved by its conv
        settings["tokens"] = max_len = int(hf["max_source_positions"])
        if hf.get("num_mel_bins") != settings["feature_size"] or settings["n_samples"] // settings["hop_length"] != \
                2 * max_len:
            raise CheckpointError(source.path, "the feature extractor's feature_size/chunk_length do not match "
                                               "config.json's num_mel_bins/max_source_positions")
    else:
        settings["conv"] = [[int(k), int(s)] for k, s in zip(hf["conv_kernel"], hf["conv_stride"], strict=True)]
        max_len = getattr(source.settings, "max_model_len", None) or conv_frames(
            DEFAULT_MAX_SECONDS * settings["sampling_rate"], [tuple(x) for x in settings["conv"]])
    num_labels = int(model.config.num_labels)
    clf = AudioClassifier(model, num_labels, stacked=settings["extractor"] in ("ast", "whisper"),
                          masked=bool(settings.get("attention_mask")), reads=reads)
    return MediaBuilt(model=clf, pooler=classify_pooler(source, hf), files=no_text_files(settings),
                      modalities=("audio",), embedding_dim=num_labels, max_model_len=max_len, labels=labels_of(hf),
                      extra={"feature extractor": settings["extractor"], "sampling rate": settings["sampling_rate"]})


FAMILY = MediaFamily("audio_classify", build, "transformers audio classifier (padded), logits in the LAST row",
                     tasks=("classify",), modalities=("audio",))


def architectures() -> list[str]:
    """The classes transformers' ``AutoModelForAudioClassification`` maps whose model type's feature extractor is
    wav2vec2's, AST's or Whisper's."""
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES

    return [name for kind, name in MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES.items()
            if isinstance(name, str) and FEATURE_EXTRACTOR_MAPPING_NAMES.get(kind) in EXTRACTORS]
