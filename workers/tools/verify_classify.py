"""``poolgate verify`` for image and audio classifiers: synthetic probes, served path against transformers.

An image classifier (the ``image_classify`` plan) runs the synthetic probe
images (``shared.inputs.media.synthetic.probe_images``), an audio classifier
(``audio_classify``) synthetic tone clips of several lengths at the feature
extractor's own sampling rate, through the model's plan and runner in the
worker's engine, batched and one per call; the reference is transformers'
``AutoModelFor{Image,Audio}Classification`` from the folder in float32 on its
own image processor's or feature extractor's output, one input at a time,
with the activation the config implies (softmax, or sigmoid for multi-label
and one-label models). One ``Check`` row (``classify image`` / ``classify
audio``) per dtype, comparing the served probabilities.
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from poolgate.shared.inputs.media.synthetic import data_url, probe_images, tone_wav
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.workers.engine.runner_api import LoadedModel
from poolgate.workers.pooling.classify import activation_for
from poolgate.workers.tools.verify import Check

CLIP_SECONDS = (0.25, 0.6, 1.0, 1.7)


def classify_checks(model: LoadedModel, plan: str, folder: str, served: Any, row: Any) -> list[Check]:
    """The classifier's one check (module doc); ``served``/``row``: verify_media's runner and row makers."""
    import transformers

    config = json.loads((Path(folder) / "config.json").read_text())
    activation = activation_for({**config, "num_labels": model.info.embedding_dim})
    if plan == "image_classify":
        images = [data for _, data in probe_images()]
        inputs = [MediaInput((MediaRef("image", data_url(data)),)) for data in images]
        reference = transformers.AutoModelForImageClassification.from_pretrained(folder, dtype=torch.float32).eval()
        want = np.concatenate([_image_logits(reference, folder, data) for data in images])
        name = "classify image"
    else:
        extractor = transformers.AutoFeatureExtractor.from_pretrained(folder)
        rate = int(extractor.sampling_rate)
        clips = [tone_wav(s, rate, seed=i) for i, s in enumerate(CLIP_SECONDS)]
        inputs = [MediaInput((MediaRef("audio", data_url(c, "audio/wav"), format="wav"),)) for c in clips]
        reference = transformers.AutoModelForAudioClassification.from_pretrained(folder, dtype=torch.float32).eval()
        want = np.concatenate([_audio_logits(reference, extractor, c) for c in clips])
        name = "classify audio"
    with torch.no_grad():
        probabilities = activation(torch.from_numpy(want)).numpy()
    return [row(name, model.info.dtype, served(model, inputs), probabilities)]


def _image_logits(model: Any, folder: str, data: bytes) -> np.ndarray:
    from PIL import Image
    from transformers import AutoImageProcessor
    from transformers.image_transforms import convert_to_rgb

    processor = AutoImageProcessor.from_pretrained(folder)
    rgb = convert_to_rgb(Image.open(io.BytesIO(data)), return_numpy=True)  # alpha over white, as served
    with torch.no_grad():
        return model(pixel_values=processor([rgb], return_tensors="pt")["pixel_values"]).logits.float().numpy()


def _audio_logits(model: Any, extractor: Any, wav: bytes) -> np.ndarray:
    import soundfile

    samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    features = extractor(samples, sampling_rate=rate, return_tensors="pt")
    with torch.no_grad():
        return model(**features).logits.float().numpy()
