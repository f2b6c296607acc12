"""``poolgate verify`` for a media model: texts and synthetic probe images, served path against transformers.

A dual encoder (CLIP, SigLIP, SigLIP 2 and their one-tower models: the
``clip`` plan) runs verify's probe texts and the synthetic probe images
(``shared.inputs.media.synthetic.probe_images``: odd sizes and aspect
ratios, JPEG, WEBP, GIF, an alpha channel, grey and palette modes) through
what a server runs, the model's plan and its runner in the worker's engine,
in one call (batched) and one input per call (single); the reference is
transformers' own class from the folder in float32, its tokenizer (CLIP's
texts cut to their positions and padded; SigLIP's padded to their length,
every token attended, as they were trained) and its image processor on the
decoded images, then the tower's projected features, L2-normalized. One
``Check`` row per tower and dtype (``embed text``, ``embed image``). Image and
audio classifiers are checked by ``workers.tools.verify_classify``, the
Qwen2-VL-style embedders by ``workers.tools.verify_qwen_vl``, the visual
late-interaction models by ``workers.tools.verify_late`` (ColQwen3 and
ColQwen3.5 by ``workers.tools.verify_colqwen3``).
``refuse_media_below`` is ``--verify-on-start``'s check of a media model.
"""
from __future__ import annotations

import asyncio
import io
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.inputs.media.synthetic import data_url, probe_images
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.engine.engine import Engine
from poolgate.workers.engine.runner_api import LoadedModel
from poolgate.workers.tools.verify import PROBES, Check, cosines


def verify_media(model: LoadedModel, folder: str) -> tuple[list[Check], list[str]]:
    """The checks of the media model loaded from ``folder``, and what was skipped (module doc)."""
    settings = model.encoder.files.media or {}
    plan = settings.get("plan")
    if plan in ("image_classify", "audio_classify"):  # workers.tools.verify_classify
        from poolgate.workers.tools.verify_classify import classify_checks

        return classify_checks(model, plan, folder, _served, _row), []
    if plan == "qwen_vl":  # workers.tools.verify_qwen_vl
        from poolgate.workers.tools.verify_qwen_vl import qwen_vl_checks

        return qwen_vl_checks(model, settings, folder, _served, _row)
    if plan == "colqwen3":  # workers.tools.verify_colqwen3
        from poolgate.workers.tools.verify_colqwen3 import colqwen3_checks

        return colqwen3_checks(model, settings, folder, _served, _row), []
    if plan in ("colpali", "colqwen2", "colmodernvbert"):  # workers.tools.verify_late
        from poolgate.workers.tools.verify_late import late_checks

        return late_checks(model, folder, _served, _row), []
    if plan != "clip":
        return [], [f"{task} ({model.info.architecture}: no media reference in verify)" for task in model.info.tasks]
    return dual_checks(model, settings, folder), []


def refuse_media_below(model: LoadedModel, folder: str, threshold: float) -> None:
    """``--verify-on-start`` for a media model: ValueError (start-up fails) when a tower is below ``threshold``."""
    checks, _ = verify_media(model, folder)
    failed = [c for c in checks if not c.passes(threshold)]
    if failed:
        raise ValueError(f"--verify-on-start: {folder} agrees with its reference below {threshold}: "
                         + "; ".join(c.line() for c in failed))


def _served(model: LoadedModel, inputs: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """(n, dim) vectors of ``inputs`` in one call, and one call each."""

    async def run() -> tuple[np.ndarray, np.ndarray]:
        engine = Engine(model)
        await engine.start()
        try:
            def call(xs: list[Any]) -> PoolingCall:
                return PoolingCall(request_id="verify", model=model.info.served_model_name, inputs=xs,
                                   params=PoolingParams(task=model.info.tasks[0]))

            batched = (await engine.submit(call(inputs))).outputs.values
            single = [(await engine.submit(call([x]))).outputs.values for x in inputs]
            return np.asarray(batched, np.float32), np.concatenate(single).astype(np.float32)
        finally:
            await engine.stop()

    with ThreadPoolExecutor(1) as pool:  # a loop of its own, even where the caller's thread runs one
        return pool.submit(asyncio.run, run()).result()


def _row(name: str, dtype: str, got: tuple[np.ndarray, np.ndarray], want: np.ndarray) -> Check:
    batched, single = got
    return Check(name, dtype, float(cosines(batched, want).min()), float(np.abs(batched - want).max()),
                 float(cosines(batched, single).min()))


def dual_checks(model: LoadedModel, settings: dict[str, Any], folder: str) -> list[Check]:
    """The text and image towers the model has, each against transformers (module doc)."""
    from poolgate.workers.models.media.clip import TOWERS

    spec = TOWERS[model.info.architecture]
    reference = _Reference(model.info.architecture, spec, settings, folder)
    checks = []
    if spec.text:
        texts = list(PROBES)
        checks.append(_row("embed text", model.info.dtype, _served(model, texts), reference.texts(texts)))
    if spec.image:
        images = [data for _, data in probe_images()]
        inputs = [MediaInput((MediaRef("image", data_url(data)),)) for data in images]
        checks.append(_row("embed image", model.info.dtype, _served(model, inputs), reference.images(images)))
    return checks


class _Reference:
    """transformers' model, tokenizer and image processor from the folder, in float32."""

    def __init__(self, architecture: str, spec: Any, settings: dict[str, Any], folder: str):
        import transformers

        self.spec, self.settings, self.folder = spec, settings, folder
        self.model = getattr(transformers, architecture).from_pretrained(folder, dtype=torch.float32).eval()

    def _tower(self, read: str, method: str, inputs: dict[str, torch.Tensor]) -> np.ndarray:
        with torch.no_grad():
            out = getattr(self.model, method)(**inputs).pooler_output if read == "features" else \
                getattr(self.model(**inputs), read)
        return torch.nn.functional.normalize(out.float(), dim=-1).numpy()

    def texts(self, texts: list[str]) -> np.ndarray:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.folder)
        longest = int(self.settings["text"]["max_tokens"])
        if self.spec.kind == "clip":  # cut to the tower's positions, padded in the batch, masked
            t = tokenizer(texts, padding=True, truncation=True, max_length=longest, return_tensors="pt")
            inputs = {"input_ids": t["input_ids"], "attention_mask": t["attention_mask"]}
        else:  # SigLIP: padded to its length, every token attended, as trained
            t = tokenizer(texts, padding="max_length", truncation=True, max_length=longest, return_tensors="pt")
            inputs = {"input_ids": t["input_ids"]}
        return self._tower(self.spec.text, "get_text_features", inputs)

    def images(self, images: list[bytes]) -> np.ndarray:
        from PIL import Image
        from transformers import AutoImageProcessor
        from transformers.image_transforms import convert_to_rgb

        processor = AutoImageProcessor.from_pretrained(self.folder)
        out = []
        for data in images:  # one at a time: SigLIP 2's patch grids differ by image
            rgb = convert_to_rgb(Image.open(io.BytesIO(data)), return_numpy=True)  # alpha over white, as served
            pixels = processor([rgb], return_tensors="pt")
            read = ("pixel_values", "pixel_attention_mask", "spatial_shapes")
            inputs = {k: v for k, v in pixels.items() if k in read}
            out.append(self._tower(self.spec.image, "get_image_features", inputs))
        return np.concatenate(out)
